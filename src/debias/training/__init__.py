"""Training: the shared epoch loop (loop.py), ERM (erm.py), memory checks (memory.py), stage-2 methods (methods/)."""

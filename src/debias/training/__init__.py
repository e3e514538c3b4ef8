"""Training: the shared epoch loop and model selection (loop.py), ERM (erm.py), stage-2 methods (methods/)."""

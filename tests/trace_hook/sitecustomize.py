"""Put on PYTHONPATH by tests/test_trace.py only: every Python process started with it appends what it opens,
renames, deletes and lists (``sys.addaudithook``) and every ``debias`` module it imports (a finder first on
``sys.meta_path``) to ``$DEBIAS_TRACE_LOG`` (one JSON line per event, with its pid and the ``debias`` modules on the
stack). Paths are made absolute against the working folder at the time of the event; files of the
interpreter and its installed packages are left out (they are never a stage's deps)."""

import json
import os
import sys

_LOG_PATH = os.environ.get("DEBIAS_TRACE_LOG")
_EVENTS = {"open", "os.rename", "os.remove", "os.rmdir", "os.listdir", "os.scandir", "shutil.rmtree",
           "tempfile.mkstemp", "tempfile.mkdtemp", "os.mkdir", "cpython.run_file", "sqlite3.connect"}
_SKIP = tuple(sorted({os.path.join(os.path.realpath(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))


def _absolute(value: object) -> str | None:
    if isinstance(value, int) or value is None:  # a file descriptor, or none given
        return None
    try:
        text = os.fsdecode(value)
    except TypeError:
        return None
    return os.path.normpath(os.path.join(os.getcwd(), text))


def _stack() -> list[str]:
    """The ``debias`` modules (and ``__main__``) on the stack, innermost first, each once: who asked, and on whose
    behalf (a module executing its imports is on the stack while they run)."""
    names: list[str] = []
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if (name == "__main__" or name.startswith("debias")) and name not in names:
            names.append(name)
        frame = frame.f_back
    return names


def _install(log_path: str) -> None:
    handle = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (open for the process's life)
    write = handle.write
    busy = False

    def hook(event: str, args: tuple) -> None:
        nonlocal busy
        if event not in _EVENTS or busy:
            return
        busy = True
        try:
            record: dict = {"pid": os.getpid(), "event": event}
            if event == "open":
                path, mode, flags = (list(args) + [None, None, None])[:3]
                record.update(mode=mode, flags=flags)
                paths = [_absolute(path)]
            elif event == "os.rename":
                paths = [_absolute(args[0]), _absolute(args[1])]
            else:
                paths = [_absolute(args[0] if args else None)]
            if paths[0] is None or any(p is not None and p.startswith(_SKIP) for p in paths):
                return
            record["paths"] = paths
            record["by"] = (_stack() or [""])[0]
            write(json.dumps(record) + "\n")
        except Exception:  # never change what the traced process does
            pass
        finally:
            busy = False

    sys.addaudithook(hook)

    class ImportRecorder:
        """First on ``sys.meta_path``: sees every import of a module not yet loaded (``import`` statements and
        ``importlib.import_module`` alike, which the ``import`` audit event misses), records it, finds nothing."""

        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if name == "debias" or name.startswith("debias."):
                write(json.dumps({"pid": os.getpid(), "event": "import", "module": name, "stack": _stack()}) + "\n")
            return None

    sys.meta_path.insert(0, ImportRecorder)


if _LOG_PATH:
    _install(_LOG_PATH)

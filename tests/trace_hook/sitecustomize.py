"""Put on PYTHONPATH by tests/test_trace.py only: every Python process started with it appends what it opens,
renames, deletes and lists (``sys.addaudithook``) and every ``debias`` module it imports (a finder first on
``sys.meta_path``) to ``$DEBIAS_TRACE_LOG`` (one JSON line per event, with its pid and the ``debias`` modules on the
stack). Paths are made absolute against the working folder at the time of the event; files of the
interpreter and its installed packages are left out (they are never a stage's deps)."""

import json
import os
import sys

# The stage harness refuses a hook from outside the interpreter's installation unless it declares this (it records
# what a stage does and hands it nothing)
DEBIAS_SIDE_CHANNEL = "records the files and debias modules a traced stage touches; returns nothing to it"
_STARTED_WITH = os.environ.get("DEBIAS_TRACE_LOG")
# A fork server (``python -m debias.harness.forkserver``, started by a traced launcher) holds the hook for its forks
_SERVER = "debias.harness.forkserver" in getattr(sys, "orig_argv", [])
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


class _Log:
    """The log of the process's stage: ``$DEBIAS_TRACE_LOG`` read at each event and opened (append) on its first
    event in each process, so a stage forked by the fork server (which takes the launcher's environment before
    its script runs) writes to its own stage's log. The fork server itself, and every fork of it that has not
    taken a stage's environment yet, write nothing: their variable is still the one the server started with."""

    def __init__(self) -> None:
        self.busy = False  # within the hook: the log's own open is no event of the stage
        self.key: tuple[int, str] | None = None
        self.handle = None

    def write(self, record: dict) -> None:
        path = os.environ.get("DEBIAS_TRACE_LOG")
        if not path or (_SERVER and path == _STARTED_WITH):
            return
        key = (os.getpid(), path)
        if key != self.key:
            self.handle = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (for the process's life)
            self.key = key
        self.handle.write(json.dumps(record) + "\n")


def _install() -> None:
    log = _Log()

    def hook(event: str, args: tuple) -> None:
        if event not in _EVENTS or log.busy:
            return
        log.busy = True
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
            log.write(record)
        except Exception:  # never change what the traced process does
            pass
        finally:
            log.busy = False

    sys.addaudithook(hook)

    class ImportRecorder:
        """First on ``sys.meta_path``: sees every import of a module not yet loaded (``import`` statements and
        ``importlib.import_module`` alike, which the ``import`` audit event misses), records it, finds nothing."""

        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if (name == "debias" or name.startswith("debias.")) and not log.busy:
                log.busy = True
                try:
                    log.write({"pid": os.getpid(), "event": "import", "module": name, "stack": _stack()})
                except Exception:
                    pass
                finally:
                    log.busy = False
            return None

    sys.meta_path.insert(0, ImportRecorder)


if _STARTED_WITH:
    _install()

"""What a traced stage did, read from its logs into a :class:`Trace`: the OS trace (``strace -f``, every process's
file calls: :func:`strace_command`, :func:`read_strace`) and Python's audit hook (which ``debias`` module imported
which and touched what: :func:`read_hook`). :mod:`debias.tools.trace` holds the trace against dvc.yaml."""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Trace:
    """What one stage's processes did, as the hook logged it: absolute paths and module names."""

    reads: set[str] = field(default_factory=set)  # opened to read, or linked from (link, symlink)
    writes: set[str] = field(default_factory=set)  # created, written, renamed or removed
    by: dict[str, str] = field(default_factory=dict)  # path -> the innermost debias module that first touched it
    listed: Counter[str] = field(default_factory=Counter)  # folder -> how many times its entries were read (getdents)
    listed_by: dict[str, Counter[str]] = field(default_factory=dict)  # folder -> module -> listings (the hook's)
    probed: set[str] = field(default_factory=set)  # stat, access, readlink, getxattr, chdir: what exists, what it is
    changed_metadata: set[str] = field(default_factory=set)  # chmod, chown, utime: a file's mode, owner or times
    tried: set[str] = field(default_factory=set)  # failed opens: a missing (or refused) file is an answer too
    made: set[str] = field(default_factory=set)  # files whose first event made them new (O_EXCL / O_TRUNC, a rename)
    imports: dict[str, list[str]] = field(default_factory=dict)  # module -> the debias modules on the stack then
    scripts: set[str] = field(default_factory=set)  # files run as __main__ or as a program (execve)
    # path read -> the command lines (argv joined by spaces) of the processes that read it; "" for a process whose
    # program the OS trace did not see start (the traced command's own, or a fork that ran no other program)
    readers: dict[str, set[str]] = field(default_factory=dict)

    def merge(self, other: Trace) -> Trace:
        """The union of two traces of the same stage (the OS trace's files and the hook's imports)."""
        for name in ("reads", "writes", "listed", "probed", "changed_metadata", "tried", "made", "scripts"):
            getattr(self, name).update(getattr(other, name))
        for path, who in other.by.items():
            self.by.setdefault(path, who)
        for path, commands in other.readers.items():
            self.readers.setdefault(path, set()).update(commands)
        for path, modules in other.listed_by.items():
            self.listed_by.setdefault(path, Counter()).update(modules)
        for module, stack in other.imports.items():
            self.imports.setdefault(module, stack)
        return self


def read_hook(path: Path) -> Trace:
    """What the audit hook's log adds to the OS trace: the ``debias`` modules imported (with the stack), the files
    run as ``__main__``, which module touched each file first, and which module listed each folder how many times
    (a missing log is an empty trace)."""
    trace = Trace()
    if not path.exists():
        return trace
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        event, paths = record["event"], record.get("paths") or []
        for path in paths:
            if path:
                trace.by.setdefault(os.path.realpath(path), record.get("by") or "?")
        if event == "import":
            trace.imports.setdefault(record["module"], record.get("stack") or [])
        elif event == "cpython.run_file":
            trace.scripts.update(paths)
        elif event in ("os.listdir", "os.scandir") and paths and paths[0]:
            folder = os.path.realpath(paths[0])
            trace.listed_by.setdefault(folder, Counter())[record.get("by") or "?"] += 1
    return trace


# ----------------------------------------------------------------------------------------------- the OS trace

#: The system calls :func:`strace_command` traces: every way a process reaches a file by its name.
SYSCALLS = ("open", "openat", "openat2", "creat", "truncate", "rename", "renameat", "renameat2", "link", "linkat",
            "symlink", "symlinkat", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "execve", "execveat", "stat",
            "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink", "readlinkat",
            "getdents", "getdents64", "chdir", "getxattr", "lgetxattr", "listxattr", "llistxattr", *("chmod",
            "fchmodat", "chown", "lchown", "fchownat", "utime", "utimes", "utimensat"))
# The calls that change a file's mode, owner or times: no content changes, so a snapshot (size, modification time)
# may not show them (chmod, chown), or show them only as a change of time (utime).
METADATA_CALLS = ("chmod", "fchmodat", "chown", "lchown", "fchownat", "utime", "utimes", "utimensat")


@functools.cache
def _seccomp_filter() -> tuple[str, ...]:
    """``--seccomp-bpf`` where this strace knows it (5.3 on): the kernel stops a traced process only at the calls of
    :data:`SYSCALLS`, not at every call: the same log, in less time (benchmarks/results/suite_time.md)."""
    import subprocess

    done = subprocess.run(["strace", "--seccomp-bpf", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True)
    return ("--seccomp-bpf",) if done.returncode == 0 else ()


def strace_command(log: Path) -> list[str]:
    """The prefix that runs a command under ``strace`` following every child, logging :data:`SYSCALLS` to ``log`` with
    file descriptors annotated by their paths (``-y``: a relative name is resolved against its directory's) and each
    program's arguments in full (``-s``: which git command read ``.git/`` is judged by them). Where strace can, a
    seccomp filter keeps the other calls from stopping the processes (:func:`_seccomp_filter`)."""
    return ["strace", "-f", *_seccomp_filter(), "-qq", "-y", "-s", "4096", "-e", "trace=" + ",".join(SYSCALLS),
            "-e", "signal=none", "-o", str(log)]


_CALL = re.compile(r"^(?P<pid>\d+) +(?P<name>\w+)\((?P<args>.*)\) += (?P<result>.*)$")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?')
_DIRFD = re.compile(r"^\s*(?:AT_FDCWD|-?\d+)<(?P<dir>(?:[^>\\]|\\.)*)>")
_RESULT_PATH = re.compile(r"^-?\d+<(?P<path>(?:[^>\\]|\\.)*)>")
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")


def _decode(text: str) -> str:
    """A string as strace prints it (C escapes) back to the path."""
    if "\\" not in text:
        return text
    return codecs.escape_decode(text.encode("latin-1"))[0].decode("utf-8", "surrogateescape")


def _strings(args: str) -> list[tuple[str, int, int]]:
    """The quoted strings of an argument list with their spans (a string cut short by strace ends in ``...``)."""
    return [(_decode(m.group(1)), m.start(), m.end()) for m in _STRING.finditer(args)]


def _dirfd(args: str, start: int) -> str | None:
    """The path of the ``*at`` call's directory argument just before the string at ``start`` (``AT_FDCWD</cwd>``)."""
    parts = args[:start].rstrip().rstrip(",").rsplit(",", 1)
    match = _DIRFD.match(parts[-1]) if parts and parts[-1].strip() else None
    return _decode(match.group("dir")) if match else None


def _calls(lines: list[str]) -> list[tuple[str, str, str, str]]:
    """(pid, name, args, result) of every complete call, an ``<unfinished ...>`` call joined with its ``resumed``
    line."""
    pending: dict[str, str] = {}
    calls = []
    for line in lines:
        pid, _, rest = line.partition(" ")
        rest = rest.lstrip()
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        if rest.startswith("<..."):
            head = pending.pop(pid, None)
            if head is None:
                continue
            rest = head + rest.split("resumed>", 1)[1]
        match = _CALL.match(f"{pid} {rest}")
        if match:
            calls.append((pid, match.group("name"), match.group("args"), match.group("result")))
    return calls


def read_strace(path: Path, cwd: Path, ignore: tuple[Path, ...] = ()) -> Trace:
    """The :class:`Trace` of an strace log of :func:`strace_command` (every process of the stage): reads and writes
    from successful opens (by their flags), the real path the kernel opened; failed opens as tried (a missing file is
    an answer); a folder opened (``O_DIRECTORY``) as probed, and each time its entries are read (the first
    ``getdents`` of an opened descriptor) as one listing; renames, links, removals and folders made as writes, and
    what a link points at as read; stats, accesses and link reads (failed ones too) as probes; programs run. A file
    whose first event created it afresh (``O_EXCL`` or ``O_TRUNC``, the target of a rename or link) is the stage's
    own (:attr:`Trace.made`). A relative name is resolved against its ``*at`` call's directory, else against its
    process's working folder (the last ``AT_FDCWD`` strace showed for it, ``cwd`` before any); files under ``ignore``
    (the tracer's own) are left out."""
    trace = Trace()
    if not path.exists():
        return trace
    seen: set[str] = set()
    cwds: dict[str, str] = {}
    listing: dict[tuple[str, str], str] = {}  # (pid, descriptor) -> the folder whose listing was counted on it
    programs: dict[str, str] = {}  # pid -> the command line of the program it runs (its last execve)
    skipped = tuple(os.path.join(os.path.realpath(folder), "") for folder in ignore)

    def first(target: str, fresh: bool) -> None:
        if target not in seen:
            seen.add(target)
            if fresh:
                trace.made.add(target)

    for pid, name, args, result in _calls(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()):
        ok = not result.startswith("-1")
        here = _DIRFD.match(args)
        if here and args.lstrip().startswith("AT_FDCWD"):
            cwds[pid] = _decode(here.group("dir"))
        if name in ("getdents", "getdents64"):
            descriptor = args.split("<", 1)[0].strip()
            if ok and here:
                folder = os.path.normpath(_decode(here.group("dir")))
                if listing.get((pid, descriptor)) != folder and not os.path.join(folder, "").startswith(skipped):
                    trace.listed[folder] += 1  # one listing per opened descriptor, however many calls read it
                listing[(pid, descriptor)] = folder
            continue
        strings = _strings(args)
        if not strings:
            continue
        paths = []
        for text, start, _ in strings:
            base = _dirfd(args, start) or cwds.get(pid) or str(cwd)
            paths.append(os.path.normpath(text if text.startswith("/") else os.path.join(base, text)))
        if skipped and os.path.realpath(paths[0]).startswith(skipped):
            continue
        if name in ("open", "openat", "openat2", "creat"):
            if not ok:
                trace.tried.add(paths[0])
                continue
            found = _RESULT_PATH.match(result)
            listing.pop((pid, result.split("<", 1)[0].strip()), None)  # the descriptor now names another file
            real = os.path.normpath(_decode(found.group("path"))) if found else paths[0]
            flags = args[strings[0][2]:]
            if "O_DIRECTORY" in flags:
                trace.probed.add(real)  # opened, not yet read: a listing is counted at its getdents
                continue
            writes = name == "creat" or any(flag in flags for flag in _WRITE_FLAGS)
            reads = "O_WRONLY" not in flags and name != "creat"
            first(real, name == "creat" or "O_EXCL" in flags or "O_TRUNC" in flags)
            if reads:
                trace.reads.add(real)
                trace.readers.setdefault(real, set()).add(programs.get(pid, ""))
            if writes:
                trace.writes.add(real)
        elif name in ("rename", "renameat", "renameat2"):
            if ok:
                first(paths[-1], True)
                trace.writes.update(paths)
        elif name in ("link", "linkat", "symlink", "symlinkat"):
            if ok:  # the new name's content is what it links to: a read of that, never a write of it
                target = paths[-1]
                pointed = strings[0][0]
                linked = paths[0] if name.startswith("link") else os.path.normpath(
                    pointed if pointed.startswith("/") else os.path.join(os.path.dirname(target), pointed))
                first(target, True)
                trace.writes.add(target)
                trace.reads.add(linked)
        elif name in ("unlink", "unlinkat", "rmdir", "mkdir", "mkdirat", "truncate"):
            if ok:
                first(paths[0], name.startswith("mkdir"))
                trace.writes.add(paths[0])
        elif name in ("execve", "execveat"):
            if ok:
                trace.scripts.add(os.path.realpath(paths[0]))
                programs[pid] = command_line([text for text, _, _ in strings[1:]])
        elif name == "chdir":  # into a folder: it exists; a failed chdir is an answer too
            (trace.probed if ok else trace.tried).add(paths[0])
        elif name in METADATA_CALLS:
            if args.lstrip().startswith('""') or strings[0][0] == "":  # of a descriptor (AT_EMPTY_PATH)
                continue
            if ok:
                trace.changed_metadata.add(paths[0])
                trace.writes.add(paths[0])
            else:
                trace.tried.add(paths[0])
        else:  # stat, lstat, newfstatat, statx, access, faccessat(2), readlink(at), (l)getxattr, (l)listxattr
            if args.lstrip().startswith('""') or strings[0][0] == "":  # fstat of a descriptor (AT_EMPTY_PATH)
                continue
            trace.probed.add(paths[0])
    return trace


def command_line(argv: list[str]) -> str:
    """An ``execve``'s argument list joined by spaces, its program by its name alone (``/usr/bin/git`` -> ``git``)."""
    return " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else ""

"""UMAP with a disk cache for numba's compiled code and a k-NN graph whose cost grows no faster than UMAP's (used by groups and evaluation).

``import umap`` compiles numba code and umap-learn/pynndescent cache little of it on disk, so every
stage process paid again; :func:`import_umap` sets ``NUMBA_CACHE_DIR`` (default ``~/.cache/debias/numba``)
and switches numba's cache on for their jitted functions.
:func:`umap_fit` passes the k-NN graph of :func:`knn_graph` as ``precomputed_knn``: exact (torch, in
blocks) up to :data:`EXACT_KNN_MAX_POINTS` points, above it pynndescent's NN-descent with UMAP's own
settings, seeded. The exact graph costs O(N^2); NN-descent pays a numba compilation in every process (numba
cannot cache it) and then grows about linearly, finding most but not all of the exact neighbours:
:data:`EXACT_KNN_MAX_POINTS` is where the two cost about the same (ours).
Entry points that run UMAP set ``OMP_WAIT_POLICY=PASSIVE`` before importing torch (busy OpenMP
threads left by numba slow torch down ~10x).
On a machine whose cache is empty, the fork server (:mod:`debias.harness.forkserver`) starts :func:`warm_cache` as the
pipeline starts: one small UMAP fit compiles what the stages' fits use into the cache on another core while the
first stages run, and :func:`import_umap` waits for it (:func:`wait_for_warming`) rather than compile the same
functions twice.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

NUMBA_CACHE_DEFAULT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "debias" / "numba"
# Modules whose module-level numba functions are compiled without cache=True (umap-learn 0.5, pynndescent).
NUMBA_MODULES = ("umap.umap_", "umap.layouts", "umap.utils", "umap.distances", "umap.sparse",
                 "pynndescent.pynndescent_", "pynndescent.utils", "pynndescent.rp_trees",
                 "pynndescent.distances", "pynndescent.sparse")


_numba_caching_enabled = False
WARMING_LOCK = ".debias-warming.lock"  # held (exclusive) by warm_cache while it compiles
# Ours: the longest a stage waits for warm_cache before compiling itself (the warm-up took 17 s on a 2-core machine).
WARMING_WAIT_SECONDS = 300.0


def cache_dir() -> Path:
    """numba's cache folder for UMAP: ``NUMBA_CACHE_DIR``, else ~/.cache/debias/numba."""
    return Path(os.environ.get("NUMBA_CACHE_DIR") or NUMBA_CACHE_DEFAULT)


def warm_marker() -> Path:
    """The file :func:`warm_cache` leaves once the cache holds this umap-learn / numba pair's compiled code."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = f"umap-{version('umap-learn')}-numba-{version('numba')}-pynndescent-{version('pynndescent')}"
    except PackageNotFoundError:
        versions = "unknown"
    return cache_dir() / f".debias-warm-{versions}"


def wait_for_warming(timeout: float = WARMING_WAIT_SECONDS) -> float:
    """Wait while :func:`warm_cache` compiles (its lock held), at most ``timeout`` s; the seconds waited."""
    import fcntl
    import time

    path = cache_dir() / WARMING_LOCK
    if not path.exists():
        return 0.0
    started = time.monotonic()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return time.monotonic() - started
            except OSError:
                if time.monotonic() - started > timeout:
                    return time.monotonic() - started
                time.sleep(0.05)
    finally:
        os.close(fd)


def warm_cache() -> bool:
    """Compile UMAP's numba code into the cache by one small seeded fit, under :data:`WARMING_LOCK`; leave
    :func:`warm_marker`. False when the marker was already there (nothing done)."""
    import fcntl

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / WARMING_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # another warm-up is under way
        marker = warm_marker()
        if marker.exists():
            return False
        points = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
        umap_fit(points, n_components=2, n_neighbors=15, min_dist=0.1, seed=0, waiting=False)
        marker.touch()
        return True
    finally:
        os.close(fd)


def enable_numba_caching(module_names: tuple[str, ...] = NUMBA_MODULES) -> int:
    """Turn on numba's disk cache for the module-level jitted functions of ``module_names``; return how many.

    umap-learn and pynndescent compile most of their functions without ``cache=True``, so every
    fresh process recompiled them (first fit ~15 s on 1,000 points); ``Dispatcher.enable_caching``
    is numba's own switch behind ``cache=True``. Best effort: any failure leaves a function uncached.
    """
    from numba.core.dispatcher import Dispatcher

    count = 0
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and type(getattr(value, "_cache", None)).__name__ == "NullCache":
                try:
                    value.enable_caching()
                    count += 1
                except Exception:  # no usable cache locator, dynamic globals ...: stay uncached
                    continue
    return count


def import_umap(waiting: bool = True) -> ModuleType:
    """``import umap`` with ``NUMBA_CACHE_DIR`` (default ~/.cache/debias/numba), ``OMP_WAIT_POLICY=PASSIVE``
    (only effective when OpenMP is not yet loaded: entrypoints set it first) and numba caching on; first waits
    for a :func:`warm_cache` under way (``waiting``)."""
    global _numba_caching_enabled
    os.environ.setdefault("NUMBA_CACHE_DIR", str(NUMBA_CACHE_DEFAULT))
    if waiting:
        wait_for_warming()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "numba" in sys.modules:  # numba read its config before we set the variable
        import numba

        numba.config.CACHE_DIR = numba.config.CACHE_DIR or os.environ["NUMBA_CACHE_DIR"]
    import umap

    if not _numba_caching_enabled:
        enable_numba_caching()
        _numba_caching_enabled = True
    return umap


def exact_knn(points: torch.Tensor, k: int, block: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest points of every point by Euclidean distance, itself first: ``(indices int64 [N,k], distances float32 [N,k])``.

    Exact, in float64 blocks of ``block`` rows (memory ``block * N``); ties keep the lower index.
    """
    points = points.detach().cpu().double()
    indices, distances = [], []
    for start in range(0, len(points), block):
        rows = points[start : start + block]
        squared = torch.cdist(rows, points).square()
        squared[torch.arange(len(rows)), torch.arange(start, start + len(rows))] = -1.0  # self first, even among duplicates
        nearest, index = torch.topk(squared, k, dim=1, largest=False, sorted=True)
        indices.append(index)
        distances.append(nearest.clamp(min=0).sqrt())
    return torch.cat(indices).numpy(), torch.cat(distances).float().numpy()


# Above this many points the k-NN graph is NN-descent's (sub-quadratic) instead of the exact one (quadratic).
EXACT_KNN_MAX_POINTS = 25_000


def nndescent_knn(points: torch.Tensor, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Approximate k nearest points (Euclidean, itself first) by pynndescent's NN-descent with the settings umap-learn
    uses for its own graph (trees, iterations, candidates), seeded and single-threaded, hence deterministic:
    ``(indices int64 [N,k], distances float32 [N,k])``."""
    import_umap()  # numba's cache directory and passive OpenMP waits, before pynndescent compiles
    from pynndescent import NNDescent

    n = len(points)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Cannot cache compiled function")  # nn_descent: numba cannot
        index = NNDescent(points.detach().cpu().float().numpy(), n_neighbors=k, metric="euclidean", random_state=seed,
                          n_trees=min(64, 5 + int(round(n ** 0.5 / 20.0))), n_iters=max(5, int(round(np.log2(n)))),
                          max_candidates=60, low_memory=True, n_jobs=1, compressed=False, verbose=False)
        indices, distances = index.neighbor_graph
    return indices.astype(np.int64), distances.astype(np.float32)


def knn_graph(points: torch.Tensor, k: int, seed: int, exact_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k-NN graph UMAP starts from: :func:`exact_knn` up to ``exact_max`` points (default
    :data:`EXACT_KNN_MAX_POINTS`), else :func:`nndescent_knn`; both seeded, deterministic."""
    if len(points) <= (EXACT_KNN_MAX_POINTS if exact_max is None else exact_max):
        return exact_knn(points, k)
    return nndescent_knn(points, k, seed)


def umap_fit(z: torch.Tensor, n_components: int, n_neighbors: int, min_dist: float, seed: int,
             waiting: bool = True) -> torch.Tensor:
    """UMAP(n_components, n_neighbors = min(n_neighbors, N-1), min_dist, random_state=seed) of ``z``: float [N, n_components]."""
    umap = import_umap(waiting)
    n = len(z)
    if n < 3:
        raise ValueError(f"UMAP needs at least 3 points, found {n}")
    n_neighbors = min(n_neighbors, n - 1)
    knn = knn_graph(z, n_neighbors, seed)
    reducer = umap.UMAP(n_components=n_components, n_neighbors=n_neighbors, min_dist=min_dist,
                        random_state=seed, n_jobs=1, precomputed_knn=knn)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"precomputed_knn\[2\]")  # no search index: we never transform
        embedding = reducer.fit_transform(z.detach().cpu().float().numpy())
    return torch.from_numpy(embedding).float()

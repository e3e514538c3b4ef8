"""The papers' reported numbers, with the protocol and scale they were measured at, and matching to ours.

Numbers are from ``shared/notes/papers-vs-code.md`` ("Paper numbers to compare against"), in
percent on the papers' test sets. A paper result is put beside one of our rows only when the
bias protocol and the method match; a different correlation strength or scale (data size,
epochs, model) is stated next to it, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PaperSetting:
    """How a paper ran a benchmark: the scale our numbers are compared against."""

    key: str                # e.g. "cmnist_star"
    benchmark: str          # the paper's name for the benchmark
    paper: str              # short citation
    protocol: str           # our bias.protocol that reproduces it
    strength_name: str      # "p_corr" or "rho"
    n_train: int
    n_val: int | None       # None: the paper's code has no validation split
    n_test: int
    source: str             # the images
    model: str
    epochs: str             # epochs as the paper states them, per method where they differ
    selection: str          # which checkpoint is reported
    hardware: str = "GPU"


@dataclass(frozen=True)
class PaperResult:
    """One reported number set: a method at one correlation strength, metrics in percent."""

    setting: str                   # PaperSetting.key
    method: str                    # the paper's label
    matches: tuple[str, ...]       # our method keys (see :func:`method_key`) that reproduce it
    strength: float
    metrics: dict[str, float]      # our metric key ("worst_group", "avg", "unbiased") -> percent
    std: dict[str, float] = field(default_factory=dict)


SETTINGS: dict[str, PaperSetting] = {
    "cmnist_star": PaperSetting(
        key="cmnist_star", benchmark="CMNIST*", paper="Correct-N-Contrast (Zhang et al., 2022), Table 1; std over 3 seeds from Table 11",
        protocol="foreground", strength_name="p_corr", n_train=54_000, n_val=6_000, n_test=10_000,
        source="MNIST", model="LeNet-5", epochs="ERM 5, CNC 3 (JTT: as in the JTT paper)",
        selection="ERM: last epoch; CNC: best validation worst-group accuracy"),
    "biased_mnist": PaperSetting(
        key="biased_mnist", benchmark="Biased-MNIST", paper="Unbiased Supervised Contrastive Learning (Barbano et al., 2023), Table 3",
        protocol="background", strength_name="rho", n_train=60_000, n_val=None, n_test=10_000,
        source="MNIST", model="SimpleConvNet (128-d)", epochs="80 (Adam 1e-3, batch 256); CE numbers quoted from Hong & Yang (2021)",
        selection="best test accuracy over epochs (the released code has no validation split)"),
}

_BIASED_MNIST_RHO = (0.999, 0.997, 0.995, 0.99)
# (label, our method keys): ((mean, std) at each rho of _BIASED_MNIST_RHO)
_BIASED_MNIST: dict[tuple[str, tuple[str, ...]], tuple[tuple[float, float], ...]] = {
    ("CE", ("erm",)): ((11.8, 0.7), (62.5, 2.9), (79.5, 0.1), (90.8, 0.3)),
    ("ε-SupCon", ("eps_supcon",)): ((24.36, 3.23), (74.35, 0.09), (84.13, 1.31), (91.12, 0.35)),
    ("ε-SupInfoNCE", ("eps_supinfonce",)): ((33.16, 3.57), (73.86, 0.81), (83.65, 0.36), (91.18, 0.49)),
    ("ε-SupCon + FairKL", ("eps_supcon+fairkl",)): ((89.45, 1.82), (95.75, 0.16), (96.31, 0.81), (96.72, 0.2)),
    ("ε-SupInfoNCE + FairKL", ("eps_supinfonce+fairkl",)): ((90.51, 1.55), (96.19, 0.23), (97.00, 0.06), (97.86, 0.02)),
}

RESULTS: tuple[PaperResult, ...] = (
    PaperResult("cmnist_star", "ERM", ("erm",), 0.995, {"worst_group": 0.0, "avg": 20.1}),
    PaperResult("cmnist_star", "JTT", ("jtt",), 0.995, {"worst_group": 74.5, "avg": 90.2},
                {"worst_group": 3.1, "avg": 0.8}),
    PaperResult("cmnist_star", "CNC", ("cnc",), 0.995, {"worst_group": 77.4, "avg": 90.9},
                {"worst_group": 3.0, "avg": 0.6}),
    PaperResult("cmnist_star", "GroupDRO (group labels)", (), 0.995, {"worst_group": 78.5, "avg": 90.6},
                {"worst_group": 4.5, "avg": 0.1}),
    *(PaperResult("biased_mnist", method, matches, rho, {"unbiased": mean}, {"unbiased": std})
      for (method, matches), values in _BIASED_MNIST.items() for rho, (mean, std) in zip(_BIASED_MNIST_RHO, values)),
)


def method_key(method: str, fairkl_weight: float = 0.0) -> str:
    """Our method as the papers name it: the stage-2 method, with ``+fairkl`` when FairKL is on."""
    return f"{method}+fairkl" if fairkl_weight > 0 else method


def strength_of(protocol: str, p_corr: float | None, rho: float | None) -> float | None:
    """The training correlation that the protocol's papers vary (p_corr or rho); None for other protocols."""
    return {"foreground": p_corr, "background": rho}.get(protocol)


@dataclass(frozen=True)
class Comparison:
    """A paper result beside one of our rows, for one metric."""

    result: PaperResult
    setting: PaperSetting
    our_row: str
    metric: str
    paper_value: float
    paper_std: float | None
    same_strength: bool


def compare(protocol: str, strength: float | None, our_rows: dict[str, str]) -> list[Comparison]:
    """Paper results matching ``protocol`` and a method of ``our_rows`` (row label -> method key).

    Where the paper reports our correlation strength, only that strength is kept; otherwise every
    reported strength is returned, flagged ``same_strength=False``.
    """
    out: list[Comparison] = []
    for row, key in our_rows.items():
        candidates = [r for r in RESULTS if SETTINGS[r.setting].protocol == protocol and key in r.matches]
        exact = [r for r in candidates if strength is not None and abs(r.strength - strength) < 1e-9]
        for result in exact or candidates:
            for metric, value in result.metrics.items():
                out.append(Comparison(result, SETTINGS[result.setting], row, metric, value,
                                      result.std.get(metric), bool(exact)))
    return out


def settings_for(protocol: str) -> list[PaperSetting]:
    """The paper settings that use ``protocol``."""
    return [s for s in SETTINGS.values() if s.protocol == protocol]

"""Evaluation of frozen encoders: linear probes (probe.py, its variants in logistic.py, dfr.py, postprocess.py behind
variants.py's registries, their shared helpers in linear.py) and representation metrics (representation.py)."""

from debias.evaluation.linear import select_c, stratified_halves
from debias.evaluation.probe import (FrozenEncoder, flat_scalars, head_is_trained, load_encoders, probe_encoder,
                                     probe_encoders, probe_report, split_tables)
from debias.evaluation.representation import (alignment_loss, distance_statistics, evaluate_encoders,
                                              mutual_information, representation_metrics, umap_embedding)

__all__ = [
    "FrozenEncoder", "alignment_loss", "distance_statistics", "evaluate_encoders", "flat_scalars", "head_is_trained",
    "load_encoders", "mutual_information", "probe_encoder", "probe_encoders", "probe_report", "representation_metrics",
    "select_c", "split_tables", "stratified_halves", "umap_embedding",
]

"""Group inference: bias labels of the training split from the ERM model (pred, cluster) or the truth (true).

See :mod:`debias.groups.inference` for the methods and the stored table, and
:mod:`debias.groups.matching` for Hungarian matching and the quality of inferred labels.
"""

from debias.groups.inference import (
    GROUP_COLUMNS,
    GROUPS_METRICS,
    GROUPS_TABLE,
    METHODS,
    UMAP_TRAIN,
    GroupInference,
    groups_report,
    import_umap,
    infer_groups,
    load_embedding,
    load_groups,
    report_scalars,
    save_embedding,
    save_groups,
)
from debias.groups.matching import group_quality, hungarian_map, hungarian_match, matched_accuracy, relabel

__all__ = [
    "GROUP_COLUMNS", "GROUPS_METRICS", "GROUPS_TABLE", "METHODS", "UMAP_TRAIN", "GroupInference", "group_quality",
    "groups_report", "hungarian_map", "hungarian_match", "import_umap", "infer_groups", "load_embedding",
    "load_groups", "matched_accuracy", "relabel", "report_scalars", "save_embedding", "save_groups",
]

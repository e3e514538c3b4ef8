"""Metrics, defined once and used by every stage.

``accuracy``     accuracy by group and class, worst-group, unbiased, aligned and conflicting (:func:`accuracy_report`);
``fairness``     equalized-odds and demographic-parity differences of binary tasks (:func:`fairness_report`);
``uncertainty``  Wilson intervals of group accuracies (:func:`group_accuracies`, :func:`inferred_group_accuracies`).
"""

from debias.metrics.accuracy import (ATTRIBUTE_KEYS, LABEL_FREE_SCALAR_KEYS, PAIR_KINDS, SCALAR_KEYS, accuracy_report,
                                     class_accuracies, group_accuracy, needs_bias_labels, scalars, shown)
from debias.metrics.fairness import FAIRNESS_KEYS, fairness_report, fairness_scalars
from debias.metrics.uncertainty import (GroupAccuracy, group_accuracies, inferred_group_accuracies, wilson_interval,
                                        worst_group_of)

__all__ = ["ATTRIBUTE_KEYS", "FAIRNESS_KEYS", "LABEL_FREE_SCALAR_KEYS", "PAIR_KINDS", "SCALAR_KEYS", "GroupAccuracy",
           "accuracy_report", "class_accuracies", "fairness_report", "fairness_scalars", "group_accuracies",
           "group_accuracy", "inferred_group_accuracies", "needs_bias_labels", "scalars", "shown", "wilson_interval",
           "worst_group_of"]

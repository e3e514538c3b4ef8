"""Augmented views for the self-supervised contrastive methods (WCL, DCL, HCL), by the data's modality, in one place.

:class:`Views` is built once per training split and called once per view: images ``[N,3,H,W]`` get the method's
image augmentation (the SimCLR views of :func:`debias.data.augment.simclr_view`, with the options of
``stage2.wcl``: random resized crop, colour distortion of strength ``colour_strength``, grayscale; WCL, DCL and HCL
draw the same views, so their rows differ only in the loss);
feature vectors ``[N,F]`` get SCARF's random feature corruption (:func:`tabular_view`: a random
``stage2.tabular_view.corruption_rate`` of each row's features replaced by their values in uniformly drawn
training rows, the empirical marginals; one-hot columns of one original column replaced together), the
contrastive augmentation of tabular data the WCL paper's Table 3 methods need (its text names none). The
modality comes from the split (``BiasedSplit.modality``), never from the method.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from debias.data.augment import feature_groups, tabular_view
from debias.data.store import BiasedSplit
from debias.params import Params

ImageView = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class Views:
    """``views(x, generator)``: one augmented view (float) of the rows ``x`` of ``train``."""

    def __init__(self, train: BiasedSplit, params: Params, image_view: ImageView) -> None:
        self.modality = train.modality
        self.image_view = image_view
        self.corruption_rate = params.stage2.tabular_view.corruption_rate
        self.pool = train.x if self.modality == "tabular" else None
        self.groups = (feature_groups(train.feature_names)
                       if self.modality == "tabular" and train.feature_names is not None else None)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.modality == "tabular":
            return tabular_view(x, generator, corruption_rate=self.corruption_rate, pool=self.pool, groups=self.groups)
        return self.image_view(x, generator)

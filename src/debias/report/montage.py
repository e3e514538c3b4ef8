"""What group inference discovered, shown: per class a row of training images from its largest and from its smallest
inferred group, each row named with the group's size, ERM's accuracy on it and, where the data has a true bias
attribute, that attribute's share in the group, so the shortcut the groups captured can be seen at a glance.

The rows come from ``infer_groups``' summary (:func:`debias.groups.discovered.group_summary`, written to
``data/groups/summary.json``): every example index there belongs to the (class, inferred group) it is listed under;
the images are the training split's (``data/biased/train.pt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from debias.report.card import pct
from debias.report.figures import image_strip, plt, save_figure, strip_axes

if TYPE_CHECKING:
    import torch

PER_ROW = 8  # images per inferred group shown (the summary holds as many)


def shown_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per class (in class order) its largest inferred group, then its smallest where the class has several (ties:
    the lower group id is the larger one), from the summary's rows."""
    by_class: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_class.setdefault(int(row["class"]), []).append(row)
    shown = []
    for label in sorted(by_class):
        groups = sorted(by_class[label], key=lambda r: (-int(r["n"]), int(r["group"])))
        shown.extend(groups[:1] + groups[-1:] if len(groups) > 1 else groups)
    return shown


def share_text(share: dict[str, float] | None, top: int = 2) -> str | None:
    """``'a=0: 97 %, a=1: 3 %'``: the true attribute's largest shares in a group (None without attributes)."""
    if not share:
        return None
    ordered = sorted(share.items(), key=lambda item: (-item[1], int(item[0])))[:top]
    return ", ".join(f"a={value}: {100 * fraction:.0f} %" for value, fraction in ordered)


def group_caption(row: dict[str, Any]) -> str:
    """``'class 3, inferred group 7: n = 412, ERM 97.1 % (a=3: 98 %)'``."""
    text = f"class {row['class']}, inferred group {row['group']}: n = {row['n']}, ERM {pct(row['erm_accuracy'])} %"
    share = share_text(row.get("attribute_share"))
    return f"{text} ({share})" if share else text


def _as_image(x: "torch.Tensor") -> Any:
    """A uint8 [3, H, W] image as an [H, W, 3] array for ``imshow``."""
    return x.permute(1, 2, 0).numpy()


def montage_figure(images: "torch.Tensor", rows: list[dict[str, Any]], per_row: int = PER_ROW) -> "plt.Figure":
    """One axes per shown group (:func:`shown_groups`): an :func:`image_strip` of its first ``per_row`` example
    images, titled with :func:`group_caption`. ``images``: the training split's uint8 [N, 3, H, W]."""
    shown = shown_groups(rows)
    height, width = images.shape[-2:]
    fig, axes = strip_axes(len(shown), (0.7 * per_row + 0.4, 0.95 * len(shown) + 0.3))
    for ax, row in zip(axes, shown):
        cells = {k: _as_image(images[index]) for k, index in enumerate(row["examples"][:per_row])}
        ax.imshow(image_strip(cells, per_row, height, width))
        ax.set_title(group_caption(row), fontsize=7, loc="left")
    fig.suptitle("discovered groups: per class its largest and smallest inferred group (training images)", fontsize=8)
    return fig


def draw_discovered_groups(images: "torch.Tensor", rows: list[dict[str, Any]], path: str | Path, dpi: int = 110) -> None:
    """:func:`montage_figure` written to ``path`` as PNG."""
    save_figure(montage_figure(images, rows), path, dpi)

"""The montage of the discovered groups: it shows, per class, the largest and the smallest inferred group, each row's
images are training images of the group its title names, with that group's n and ERM accuracy; and the report section
names every group, with or without a bias attribute. The sample grid's rows hold each (class, attribute)'s images in
that attribute's block. Both draw each row as one image strip, cell by cell."""

from __future__ import annotations

import json

import pytest
import torch

from debias.data.store import BiasedSplit, save_split
from debias.groups import GroupInference
from debias.groups.discovered import group_summary
from debias.report.figures import strip_cell_left
from debias.report.montage import group_caption, montage_figure, shown_groups


def data(with_attribute: bool = True) -> tuple[BiasedSplit, GroupInference, torch.Tensor]:
    """Two classes; class 0 split into inferred groups 0 (20 images), 1 (5) and 2 (9), class 1 into 3 (12) and 4 (4).
    Every image is filled with its own index (mod 256), so an image on the figure says which training point it is."""
    sizes = {(0, 0): 20, (0, 1): 5, (0, 2): 9, (1, 3): 12, (1, 4): 4}
    y = torch.cat([torch.full((n,), c) for (c, _), n in sizes.items()])
    group = torch.cat([torch.full((n,), g) for (_, g), n in sizes.items()])
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # groups interleaved in the split
    y, group = y[order], group[order]
    x = torch.arange(len(y)).remainder(256).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 4, 4).clone()
    a = torch.where(group % 2 == 0, y, 1 - y) if with_attribute else torch.full_like(y, -1)
    train = BiasedSplit(x, y, a, a == y, 2, 2)
    inference = GroupInference(a.clamp(min=0), group, group % 2 == 1, y=y.clone())
    logits = torch.nn.functional.one_hot(torch.where(group == 1, 1 - y, y), 2).float()  # ERM wrong on group 1 only
    return train, inference, logits


def test_per_class_the_largest_and_the_smallest_group_are_shown() -> None:
    train, inference, logits = data()
    rows = group_summary(inference, train, logits, seed=0)
    assert [(r["class"], r["group"], r["n"]) for r in shown_groups(rows)] == [(0, 0, 20), (0, 1, 5), (1, 3, 12),
                                                                               (1, 4, 4)]


def shown_indices(ax, slots: int = 8) -> list[int]:
    """The training points an axes' image strip shows, cell by cell (each test image is filled with its index);
    every gap between cells and every empty cell transparent."""
    strip = ax.images[0].get_array()
    width = 4  # the test images' width
    shown = []
    for k in range(slots):
        left = strip_cell_left(k, width)
        cell = strip[:, left : left + width]
        if k + 1 < slots:
            assert (strip[:, left + width : strip_cell_left(k + 1, width), 3] == 0).all()  # the gap: transparent
        if cell[..., 3].all():
            assert (cell[..., :3] == cell[0, 0, 0]).all()  # one whole image in the cell
            shown.append(int(cell[0, 0, 0]))
        else:
            assert not cell[..., 3].any()  # an empty cell: nothing drawn
    return shown


def test_each_row_shows_images_of_the_group_its_title_names_with_n_and_erm_accuracy() -> None:
    train, inference, logits = data()
    rows = group_summary(inference, train, logits, seed=0)
    fig = montage_figure(train.x, rows)
    assert len(fig.axes) == 4 and all(len(ax.images) == 1 for ax in fig.axes)  # one strip per shown group
    for ax, row in zip(fig.axes, shown_groups(rows)):
        title = ax.get_title(loc="left")
        assert title == group_caption(row) and f"inferred group {row['group']}: n = {row['n']}" in title
        shown = shown_indices(ax)
        assert shown == row["examples"][:8] and len(shown) == min(8, row["n"])
        # every image drawn is a training point of exactly the class and inferred group the title names
        assert all(int(train.y[i]) == row["class"] and int(inference.inferred_group[i]) == row["group"] for i in shown)
    assert fig.axes[1].get_title(loc="left").startswith("class 0, inferred group 1: n = 5, ERM 0.0 %")
    assert "(a=1: 100 %)" in fig.axes[1].get_title(loc="left")
    assert fig.axes[0].get_title(loc="left") == "class 0, inferred group 0: n = 20, ERM 100.0 % (a=0: 100 %)"


def test_the_sample_grid_shows_per_class_row_each_attributes_images_in_its_block(tmp_path, monkeypatch) -> None:
    """samples.png: one strip per class, block a of each holding up to 3 images of (class, attribute a) (none where
    the group is empty), the blocks titled a=0, a=1."""
    from debias.report import figures

    train, _, _ = data()
    drawn = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, dpi=110: drawn.setdefault("fig", fig))
    figures.sample_grid(train, tmp_path / "samples.png", per_group=3)
    fig = drawn["fig"]
    assert len(fig.axes) == 2 and [ax.get_ylabel() for ax in fig.axes] == ["y=0", "y=1"]
    assert [t.get_text() for t in fig.axes[0].texts] == ["a=0", "a=1"]
    for label, ax in enumerate(fig.axes):
        strip = ax.images[0].get_array()
        for attr in range(2):
            members = int(((train.y == label) & (train.a == attr)).sum())
            shown = []
            for k in range(3):
                left = strip_cell_left(attr * 3 + k, 4)
                if strip[:, left : left + 4, 3].all():
                    shown.append(int(strip[0, left, 0]))
            assert len(shown) == min(3, members) and len(set(shown)) == len(shown)
            assert all(int(train.y[i]) == label and int(train.a[i]) == attr for i in shown)
    figures.plt.close(fig)


def test_without_a_bias_attribute_the_share_is_left_out() -> None:
    train, inference, logits = data(with_attribute=False)
    rows = group_summary(inference, train, logits, seed=0)
    fig = montage_figure(train.x, rows)
    assert fig.axes[0].get_title(loc="left") == "class 0, inferred group 0: n = 20, ERM 100.0 %"


@pytest.mark.slow
def test_the_report_section_draws_the_montage_and_names_every_group(tmp_path) -> None:
    from debias.report.artifacts import FIGURE_FILES, draw_discovered
    from debias.report.inputs import load_inputs
    from debias.report.sections.group_inference import groups_section

    for with_attribute in (True, False):
        train, inference, logits = data(with_attribute)
        root = tmp_path / str(with_attribute)
        save_split(root / "data/biased/train.pt", train)
        rows = group_summary(inference, train, logits, seed=0)
        (root / "data/groups").mkdir(parents=True)
        (root / "data/groups/summary.json").write_text(json.dumps({"method": "cluster", "groups": rows}))
        inputs = load_inputs(root)
        assert draw_discovered(inputs, root, dpi=40) and (root / FIGURE_FILES["discovered"]).stat().st_size > 0
        section = groups_section(inputs, {"groups_umap": False, "discovered": True})
        text = repr(section)
        assert all(group_caption(row) in text for row in shown_groups(rows))  # the figure's caption names them
        table = next(b for b in section.blocks if getattr(b, "headers", None) and "inferred group" in b.headers)
        assert [(r[0], r[1], r[3]) for r in table.rows] == [("0", "0", "20"), ("0", "2", "9"), ("0", "1", "5"),
                                                           ("1", "3", "12"), ("1", "4", "4")]
        assert table.rows[2][4].startswith("0.0 [")  # ERM's accuracy on group 1, with its interval
        shares = [r[5] for r in table.rows]
        if with_attribute:
            assert shares[0] == "a=0: 100 %"
        else:
            assert all(s == "n/a (needs bias labels)" for s in shares)
    missing = groups_section(load_inputs(tmp_path / "empty"), {"groups_umap": False, "discovered": False})
    assert "data/groups/summary.json` not found" in repr(missing)

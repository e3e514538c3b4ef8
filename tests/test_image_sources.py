"""Real-image sources (imagefolder, waterbirds, celeba, cifar10) on tiny files written in each dataset's own
format, every bad-input case of imagefolder, the params that combine them, and the corruption protocol."""

from __future__ import annotations

import pickle
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from debias.data import corruptions
from debias.data.bias import BiasProtocolError, corruption_indices, inject_bias, summarise
from debias.data.sources import DataSourceError, RawSplit, cap_splits, load_source
from debias.data.sources.base import cap_index
from debias.data.sources.cifar import read_cifar_batch
from debias.data.sources.images import fit_box
from debias.params import CELEBA_ATTRIBUTES, BiasParams, DataParams, ParamsError
from debias.schema import validate

BACKGROUNDS = {0: (40, 160, 40), 1: (30, 60, 200)}  # attribute: land green, water blue
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


def draw_shape(label: int, place: int, width: int = 20, height: int = 16) -> Image.Image:
    """A white square (class 0) or disc (class 1) on a green (0) or blue (1) background."""
    image = Image.new("RGB", (width, height), BACKGROUNDS[place])
    box = (width // 2 - 5, height // 2 - 5, width // 2 + 5, height // 2 + 5)
    (ImageDraw.Draw(image).rectangle if label == 0 else ImageDraw.Draw(image).ellipse)(box, fill=(255, 255, 255))
    return image


def write_shapes(folder, per_group: dict[str, int], suffix: str = ".png", subdir=lambda y: f"class_{y}") -> pd.DataFrame:
    """Images of every (class, place) group, ``per_group[split]`` of each per split; returns Waterbirds' metadata table."""
    rows = []
    for split, count in per_group.items():
        for label in (0, 1):
            for place in (0, 1):
                for i in range(count):
                    name = f"{subdir(label)}/{split}_{label}{place}_{i}{suffix}"
                    (folder / name).parent.mkdir(parents=True, exist_ok=True)
                    draw_shape(label, place).save(folder / name)
                    rows.append({"img_id": len(rows) + 1, "img_filename": name, "y": label, "split": SPLIT_CODES[split],
                                 "place": place, "place_filename": f"/x/{place}.jpg"})
    return pd.DataFrame(rows)


@pytest.fixture
def shapes(tmp_path):
    """An image folder with Waterbirds' metadata.csv layout: 3 / 2 / 2 images per group in train / val / test."""
    root = tmp_path / "shapes"
    table = write_shapes(root, {"train": 3, "val": 2, "test": 2})
    table.to_csv(root / "metadata.csv", index=False)
    return root, table


def folder_params(root, size: int = 12, **spec) -> DataParams:
    return DataParams(source="imagefolder", image_size=size, imagefolder={"root": str(root), **spec})


def no_network(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the test tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# --------------------------------------------------------------------------- imagefolder


def test_imagefolder_reads_official_splits_groups_and_size(shapes, tmp_path, monkeypatch) -> None:
    root, table = shapes
    no_network(monkeypatch)
    splits = load_source(folder_params(root, size=12), tmp_path, seed=0)
    for name, code in SPLIT_CODES.items():
        rows = table[table.split == code]
        split = splits[name]
        assert split.x.shape == (len(rows), 12, 12, 3) and split.x.dtype == np.uint8
        assert np.array_equal(split.y, rows.y.to_numpy()) and np.array_equal(split.a, rows.place.to_numpy())
        corner = split.x[:, 0, 0].astype(int)  # the background colour carries the attribute
        assert np.abs(corner - np.array([BACKGROUNDS[p] for p in split.a])).max() <= 2
        assert (split.x[:, 6, 6] > 240).all()  # the white shape in the middle
    biased = inject_bias(splits, BiasParams(protocol="given"), seed=0)
    assert biased["train"].group_counts().tolist() == [[3, 3], [3, 3]]
    assert biased["test"].x.shape == (8, 3, 12, 12)


def test_example_folder_is_biased_in_training_balanced_elsewhere_and_read_by_the_defaults(tmp_path) -> None:
    from debias.tools.cli import main as cli_main

    root = tmp_path / "example"
    assert cli_main(["example-folder", str(root), "--n-train", "40", "--n-eval", "8", "--rho", "0.9", "--size", "16"]) == 0
    splits = load_source(DataParams(source="imagefolder", image_size=16, imagefolder={"root": str(root)}), tmp_path, 0)
    biased = inject_bias(splits, BiasParams(protocol="given"), seed=0)
    assert biased["train"].group_counts().tolist() == [[18, 2], [2, 18]]  # round(20 * 0.9) aligned per class
    assert biased["val"].group_counts().tolist() == biased["test"].group_counts().tolist() == [[2, 2], [2, 2]]
    squares, discs = [(splits["train"].x[splits["train"].y == label] > 200).all(-1).sum((1, 2)) for label in (0, 1)]
    assert squares.mean() > discs.mean()  # a square of half-side r covers 4r^2 pixels, a disc of radius r pi r^2
    assert cli_main(["example-folder", str(root), "--rho", "0.3"]) == 2


def test_imagefolder_root_is_relative_to_the_repository_and_fingerprinted(shapes, tmp_path, monkeypatch) -> None:
    from debias.data.sources.base import external_files

    root, table = shapes
    monkeypatch.setenv("DVC_ROOT", str(root.parent))  # as under dvc exp run --temp: cwd is a temporary copy
    monkeypatch.chdir(tmp_path / "..")
    params = folder_params(root.name)
    assert external_files(params) == {"data.imagefolder.root": root}  # the source stage digests this folder
    assert len(load_source(params, tmp_path, seed=0)["train"]) == int((table.split == 0).sum())


def test_imagefolder_parquet_without_split_column_is_split_stratified_and_seeded(shapes, tmp_path) -> None:
    root, table = shapes
    table.drop(columns="split").to_parquet(root / "meta.parquet")
    params = folder_params(root, metadata="meta.parquet", split_column=None)
    params.val_fraction, params.test_fraction = 0.25, 0.25
    splits = load_source(params, tmp_path, seed=0)
    assert sum(len(s) for s in splits.values()) == len(table)
    assert [int((splits["test"].y == c).sum()) for c in (0, 1)] == [4, 4]  # round(14 / 4) of each class
    again = load_source(params, tmp_path, seed=0)
    other = load_source(params, tmp_path, seed=1)
    assert np.array_equal(again["val"].x, splits["val"].x) and not np.array_equal(other["val"].x, splits["val"].x)


def test_text_labels_are_refused_with_the_mapping_then_mapped_when_named(shapes, tmp_path) -> None:
    root, table = shapes
    numbers = table[table.split == 0].y.to_numpy()
    table["y"] = table.y.map({0: "landbird", 1: "waterbird"})
    table.to_csv(root / "metadata.csv", index=False)
    with pytest.raises(DataSourceError, match=r"column 'y' holds non-integer values \(landbird, waterbird\); set "
                                              r"data.imagefolder.label_values .*\[landbird, waterbird\]"):
        load_source(folder_params(root), tmp_path, seed=0)
    splits = load_source(folder_params(root, label_values=["waterbird", "landbird"]), tmp_path, seed=0)
    assert np.array_equal(splits["train"].y, 1 - numbers)  # waterbird is class 0 now, as named


def test_fit_box_stretch_and_center_square() -> None:
    assert fit_box(200, 100, "stretch", 1.0) == (0, 0, 200, 100)
    assert fit_box(200, 100, "center_square", 1.0) == (50, 0, 150, 100)
    assert fit_box(256, 256, "stretch", 0.875) == (16, 16, 240, 240)  # Resize(256) + CenterCrop(224)


def test_cap_is_applied_before_decoding_with_the_same_draws() -> None:
    index = {"train": np.arange(50), "val": np.arange(50, 60), "test": np.arange(60, 90)}
    splits = {name: RawSplit(rows[:, None, None].astype(np.uint8), rows) for name, rows in index.items()}
    capped = cap_index(index, 12, seed=3)
    expected = cap_splits(splits, 12, seed=3)
    assert all(np.array_equal(capped[name], expected[name].y) for name in index)


def _break(kind: str, root, table: pd.DataFrame) -> dict:
    """Damage the shapes folder in one way; returns imagefolder params to use."""
    if kind == "missing_files":
        for name in table.img_filename[:7]:
            (root / name).unlink()
    elif kind == "unreadable_files":
        for name in table.img_filename[:2]:
            (root / name).write_bytes(b"not an image")
    elif kind == "unknown_column":
        return {"attribute_column": "background"}
    elif kind == "class_absent":
        table[~((table.split == 2) & (table.y == 1))].to_csv(root / "metadata.csv", index=False)
    elif kind == "attribute_absent":
        table[~((table.split == 1) & (table.place == 0))].to_csv(root / "metadata.csv", index=False)
    elif kind == "empty_label":
        table.astype({"y": float}).assign(y=lambda t: t.y.where(t.index != 4)).to_csv(root / "metadata.csv", index=False)
    elif kind == "negative_label":
        table.assign(y=table.y - 1).to_csv(root / "metadata.csv", index=False)
    elif kind == "fractional_label":
        table.assign(y=table.y + 0.5).to_csv(root / "metadata.csv", index=False)
    elif kind == "unnamed_label":
        return {"label_values": [0, 2]}
    elif kind == "unclaimed_split":
        table.assign(split=table.split.replace(2, 3)).to_csv(root / "metadata.csv", index=False)
    elif kind == "missing_table":
        return {"metadata": "nope.csv"}
    elif kind == "garbage_table":
        (root / "bad.parquet").write_bytes(b"garbage")
        return {"metadata": "bad.parquet"}
    elif kind == "odd_suffix":
        (root / "meta.xlsx").write_bytes(b"")
        return {"metadata": "meta.xlsx"}
    return {}


@pytest.mark.parametrize(("kind", "message"), [
    ("missing_files", r"7 of 28 image file\(s\) are missing: .*class_0/train_00_0.png.* and 2 more"),
    ("unreadable_files", r"imagefolder train: 2 of 12 image file\(s\) could not be decoded: .*train_00_0.png.*"
                         r"UnidentifiedImageError"),
    ("unknown_column", r"no column for data.imagefolder.attribute_column = 'background'; columns present: "
                       r"\['img_id', 'img_filename', 'y', 'split', 'place', 'place_filename'\]"),
    ("class_absent", r"split 'test' has no image with y = 1"),
    ("attribute_absent", r"split 'val' has no image with place = 0"),
    ("empty_label", r"column 'y' is empty in 1 row\(s\) \(rows 4\)"),
    ("negative_label", r"column 'y' holds negative values"),
    ("fractional_label", r"column 'y' holds non-integer values"),
    ("unnamed_label", r"column 'y' holds 1, not in data.imagefolder.label_values = \[0, 2\]"),
    ("unclaimed_split", r"column 'split' holds 3, which no split claims"),
    ("missing_table", r"metadata table .*nope.csv does not exist"),
    ("garbage_table", r"metadata table .*bad.parquet is not readable"),
    ("odd_suffix", r"suffix '.xlsx' is not read; allowed"),
])
def test_bad_image_folders_are_named(shapes, tmp_path, kind: str, message: str) -> None:
    root, table = shapes
    spec = _break(kind, root, table)
    with pytest.raises(DataSourceError, match=message):
        load_source(folder_params(root, **spec), tmp_path, seed=0)


def test_root_that_is_not_a_folder_and_the_memory_threshold(shapes, tmp_path) -> None:
    root, _ = shapes
    with pytest.raises(DataSourceError, match="data.imagefolder.root = .* is not a folder"):
        load_source(folder_params(root / "absent"), tmp_path, seed=0)
    params = folder_params(root, size=64)
    params.memory_gb = 1e-4  # 107 KB: 28 images x 64 x 64 x 3 x 2 copies = 688 KB
    with pytest.raises(DataSourceError, match=r"28 images at 64x64 need about 0.0 GiB .*more than data.memory_gb = "
                                              r"0.0001 .*lower data.image_size \(at most 25 fits\)"):
        load_source(params, tmp_path, seed=0)


# --------------------------------------------------------------------------- second round (issue 23): silent cases


def test_sixteen_bit_pngs_are_scaled_by_their_range_and_unscaled_modes_refused(shapes, tmp_path) -> None:
    """A real I;16 PNG (Pillow's convert('RGB') clips it to all-255) decodes to round(v * 255 / 65535)."""
    root, table = shapes
    name = table[table.split == 0].img_filename.iloc[0]
    grey = np.full((16, 20), 32896, dtype=np.uint16)  # 32896 = 128 * 257: exactly 128 on 8 bits
    grey[:, :10] = 65535
    Image.fromarray(grey).save(root / name)
    with Image.open(root / name) as check:
        assert check.mode == "I;16"  # the file really is 16-bit
    splits = load_source(folder_params(root, size=20), tmp_path, seed=0)
    first = splits["train"].x[0]
    assert np.array_equal(first[:, 12:], np.full((20, 8, 3), 128, np.uint8))
    assert (first[:, :8] == 255).all()
    Image.fromarray(np.full((16, 20), 0.5, dtype=np.float32)).save(root / "float.tiff")  # mode F: no known range
    table.loc[table.img_filename == name, "img_filename"] = "float.tiff"
    table.to_csv(root / "metadata.csv", index=False)
    with pytest.raises(DataSourceError, match=r"could not be decoded: .*float.tiff.*mode F \(32-bit float pixels\) has "
                                              r"no known value range"):
        load_source(folder_params(root), tmp_path, seed=0)


def test_an_image_listed_twice_is_refused_naming_it_and_its_rows(shapes, tmp_path) -> None:
    root, table = shapes
    repeated = table.iloc[[3, 3, 5]].copy()
    repeated.iloc[1, repeated.columns.get_loc("img_filename")] = "./" + repeated.iloc[1].img_filename  # same file
    doubled = pd.concat([table, repeated], ignore_index=True).drop(columns="split")
    doubled.to_csv(root / "dup.csv", index=False)
    first, second = table.img_filename.iloc[3], table.img_filename.iloc[5]
    with pytest.raises(DataSourceError, match=rf"lists 2 image\(s\) more than once in column 'img_filename': "
                                              rf".*{first} \(rows 3, 28, 29\), .*{second} \(rows 5, 30\).*drop the repeated"):
        load_source(folder_params(root, metadata="dup.csv", split_column=None), tmp_path, seed=0)


def test_list_values_that_match_no_row_are_refused_naming_the_values_present(shapes, tmp_path) -> None:
    root, table = shapes
    with pytest.raises(DataSourceError, match=r"label_values names 2, which no row .* holds in column 'y'; the values "
                                              r"present: 0, 1"):
        load_source(folder_params(root, label_values=[0, 1, 2]), tmp_path, seed=0)
    table[table.split != 2].to_csv(root / "no_test.csv", index=False)
    with pytest.raises(DataSourceError, match=r"split_values \(test: 2\) matches no row .* column 'split' holds 0, 1"):
        load_source(folder_params(root, metadata="no_test.csv"), tmp_path, seed=0)


def write_linked_folder(tmp_path):
    """An image folder whose images live partly behind a linked folder and partly outside the root (``../``), with
    its table elsewhere (an absolute data.imagefolder.metadata): what a folder walk of the root misses."""
    store, root, tables = tmp_path / "store", tmp_path / "root", tmp_path / "tables"
    table = write_shapes(store, {"train": 3, "val": 2, "test": 2})
    root.mkdir()
    tables.mkdir()
    (root / "linked").symlink_to(store / "class_0", target_is_directory=True)  # class 0 behind a linked folder
    table["img_filename"] = [name.replace("class_0/", "linked/") if name.startswith("class_0/") else f"../store/{name}"
                             for name in table.img_filename]  # class 1 outside the root
    table.to_csv(tables / "meta.csv", index=False)
    return root, tables / "meta.csv", table


@pytest.mark.slow
def test_the_fingerprint_follows_links_dot_dot_paths_and_a_table_elsewhere(tmp_path) -> None:
    """The source stage's fingerprint (pipeline/source.py, run for real) changes when an image behind a linked
    folder, an image outside the root or the table elsewhere changes, and not for a file the table does not name."""
    from tests.faults.conftest import make_workspace, run_stage

    root, meta, table = write_linked_folder(tmp_path)
    workspace = make_workspace(tmp_path / "ws", {"data": {"source": "imagefolder", "image_size": 16, "max_per_split": None,
                                                          "imagefolder": {"root": str(root), "metadata": str(meta)}}})

    def fingerprint() -> str:
        done = run_stage(workspace, "source")
        assert done.returncode == 0, done.stderr
        return (workspace / "data" / "source.json").read_text()

    first = fingerprint()
    assert len(load_source(folder_params(root, metadata=str(meta)), tmp_path, seed=0)["train"]) == 12
    (root / "unrelated.txt").write_text("not an image of the table")
    assert fingerprint() == first
    changes = {
        "linked folder": lambda: draw_shape(1, 1).save(root / table.img_filename.iloc[0]),
        "../ image": lambda: draw_shape(0, 0).save(root / table.img_filename.iloc[3]),
        "table elsewhere": lambda: meta.write_text(meta.read_text().replace(",1,0,", ",1,1,", 1)),
    }
    for what, change in changes.items():
        before = fingerprint()
        change()
        assert fingerprint() != before, what


def _check_params(tmp_path, imagefolder: dict) -> tuple[int, str]:
    import io
    from contextlib import redirect_stderr

    import yaml

    from debias.tools.cli import main as cli_main
    from tests.conftest import committed_text

    params = yaml.safe_load(committed_text("params.yaml"))
    params["data"].update(source="imagefolder", imagefolder=imagefolder)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    errors = io.StringIO()
    with redirect_stderr(errors):
        code = cli_main(["check-params", str(path)])
    return code, errors.getvalue()


def test_check_params_checks_an_image_folder_cheaply(shapes, tmp_path) -> None:
    root, table = shapes
    assert _check_params(tmp_path, {"root": str(root)}) == (0, "")
    code, message = _check_params(tmp_path, {"root": str(root / "absent")})
    assert code == 2 and "is not a folder" in message
    code, message = _check_params(tmp_path, {"root": str(root), "attribute_column": "background"})
    assert code == 2 and "no column for data.imagefolder.attribute_column = 'background'" in message
    (root / table.img_filename.iloc[4]).unlink()
    code, message = _check_params(tmp_path, {"root": str(root)})
    assert code == 2 and f"1 of 28 image file(s) are missing: {root / table.img_filename.iloc[4]}" in message
    code, message = _check_params(tmp_path, {"root": str(root), "metadata": "absent.csv"})
    assert code == 2 and "absent.csv does not exist" in message


def test_example_folder_refuses_a_folder_that_is_not_empty_unless_forced(tmp_path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metadata.csv").write_text("my own table\n")
    (mine / "notes.txt").write_text("mine\n")
    assert cli_main(["example-folder", str(mine), "--n-train", "8", "--n-eval", "4"]) == 2
    refused = capsys.readouterr().err
    assert "is not empty (metadata.csv, notes.txt)" in refused and "pass --force" in refused
    assert (mine / "metadata.csv").read_text() == "my own table\n" and not (mine / "images").exists()
    assert cli_main(["example-folder", str(mine / "notes.txt")]) == 2  # a file
    assert cli_main(["example-folder", str(mine), "--n-train", "8", "--n-eval", "4", "--force"]) == 0
    assert (mine / "notes.txt").read_text() == "mine\n" and (mine / "metadata.csv").read_text().startswith("img_filename")


# --------------------------------------------------------------------------- waterbirds, celeba, cifar10


def test_waterbirds_archive_layout_offline(tmp_path, monkeypatch) -> None:
    import torchvision.datasets.utils

    folder = tmp_path / "waterbirds" / "waterbird_complete95_forest2water2"
    table = write_shapes(folder, {"train": 4, "val": 2, "test": 3}, suffix=".jpg",
                         subdir=lambda y: "001.Black_footed_Albatross" if y else "014.Indigo_Bunting")
    table.to_csv(folder / "metadata.csv", index=False)
    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive",
                        lambda *a, **k: pytest.fail("downloaded although the files are there"))
    no_network(monkeypatch)
    splits = load_source(DataParams(source="waterbirds", image_size=16), tmp_path, seed=0)
    assert {name: len(split) for name, split in splits.items()} == {"train": 16, "val": 8, "test": 12}
    biased = inject_bias(splits, BiasParams(protocol="given"), seed=0)
    assert biased["val"].group_counts().tolist() == [[2, 2], [2, 2]]
    assert torch.equal(biased["train"].g, biased["train"].y * 2 + biased["train"].a)
    assert biased["test"].x.shape[1:] == (3, 16, 16)


def test_waterbirds_download_failure_says_where_to_put_the_archive(tmp_path, monkeypatch) -> None:
    import torchvision.datasets.utils

    def fail(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive", fail)
    with pytest.raises(DataSourceError, match=r"waterbird_complete95_forest2water2.tar.gz could not be downloaded .*"
                                              r"extract waterbird_complete95_forest2water2.tar.gz into"):
        load_source(DataParams(source="waterbirds"), tmp_path, seed=0)


def write_celeba(folder, n: int = 30, seed: int = 0) -> pd.DataFrame:
    """torchvision's CelebA layout: img_align_celeba/*.jpg, list_attr_celeba.txt (count, header, -1/1 rows),
    list_eval_partition.txt; 18 x 22 portrait images whose top rows are bright for Blond_Hair."""
    rng = np.random.default_rng(seed)
    (folder / "img_align_celeba").mkdir(parents=True)
    attrs = rng.choice([-1, 1], size=(n, len(CELEBA_ATTRIBUTES)))
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    blond, male = CELEBA_ATTRIBUTES.index("Blond_Hair"), CELEBA_ATTRIBUTES.index("Male")
    attrs[:, blond] = np.tile([1, 1, -1, -1], n // 4 + 1)[:n]
    attrs[:, male] = np.tile([1, -1, 1, -1], n // 4 + 1)[:n]
    partition = np.repeat([0, 1, 2], [n - 8, 4, 4])
    for name, row in zip(names, attrs):
        pixels = np.full((22, 18, 3), 60, np.uint8)
        pixels[:2] = 250 if row[blond] > 0 else 20
        Image.fromarray(pixels).save(folder / "img_align_celeba" / name, quality=95)
    lines = [str(n), " ".join(CELEBA_ATTRIBUTES)] + [f"{name} " + " ".join(f"{v:2d}" for v in row) for name, row in zip(names, attrs)]
    (folder / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (folder / "list_eval_partition.txt").write_text("".join(f"{name} {p}\n" for name, p in zip(names, partition)))
    return pd.DataFrame({"blond": attrs[:, blond] > 0, "male": attrs[:, male] > 0, "partition": partition})


def test_celeba_torchvision_layout_offline_with_target_and_attribute(tmp_path, monkeypatch) -> None:
    truth = write_celeba(tmp_path / "celeba" / "celeba")
    no_network(monkeypatch)
    splits = load_source(DataParams(source="celeba", image_size=16), tmp_path, seed=0)
    for code, name in enumerate(("train", "val", "test")):
        rows = truth[truth.partition == code]
        assert np.array_equal(splits[name].y, rows.blond.to_numpy(int))  # data.celeba.target: Blond_Hair
        assert np.array_equal(splits[name].a, rows.male.to_numpy(int))  # data.celeba.attribute: Male
    train = splits["train"]
    assert train.x.shape == (22, 16, 16, 3)
    # center_square keeps the central 18 x 18 of the 18 x 22 faces: the two bright top rows are cut away
    assert train.x[:, 0].mean() < 100
    other = load_source(DataParams(source="celeba", image_size=16, celeba={"target": "Male", "attribute": "Blond_Hair"}),
                        tmp_path, seed=0)
    assert np.array_equal(other["test"].y, splits["test"].a)


def test_celeba_without_files_or_network_says_what_to_place(tmp_path, monkeypatch) -> None:
    import torchvision.datasets

    def fail(*args, **kwargs):
        raise RuntimeError("gdown is not installed")

    monkeypatch.setattr(torchvision.datasets, "CelebA", fail)
    with pytest.raises(DataSourceError, match=r"CelebA could not be downloaded .*pip install gdown.*img_align_celeba/.*"
                                              r"list_attr_celeba.txt and list_eval_partition.txt"):
        load_source(DataParams(source="celeba"), tmp_path, seed=0)


def write_cifar(folder, per_batch: int = 20, seed: int = 0) -> dict[str, np.ndarray]:
    """The official python batches: pickled dicts with b'data' uint8 [N, 3072] (channel-major) and b'labels'."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in np.arange(per_batch) % 10]
        with open(folder / name, "wb") as handle:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [f"{i}.png".encode() for i in range(per_batch)]}, handle, protocol=2)
        written[name] = data
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
                                      b"ship", b"truck"]}, handle, protocol=2)
    return written


def test_cifar10_from_pickled_batches_offline(tmp_path, monkeypatch) -> None:
    written = write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py")
    no_network(monkeypatch)
    params = DataParams(source="cifar10", image_size=32, cifar10={"val_size": 30})
    splits = load_source(params, tmp_path, seed=0)
    assert {name: len(split) for name, split in splits.items()} == {"train": 70, "val": 30, "test": 20}
    test = splits["test"]
    assert test.x.shape == (20, 32, 32, 3)
    assert np.array_equal(test.x[3, :, :, 1].ravel(), written["test_batch"][3, 1024:2048])  # channel-major rows
    assert np.array_equal(test.y, np.arange(20) % 10)
    seen = np.concatenate([splits["train"].x, splits["val"].x]).reshape(100, -1)
    official = np.concatenate([written[f"data_batch_{i}"] for i in range(1, 6)]).reshape(100, 3, 32, 32)
    assert set(map(bytes, seen)) == set(map(bytes, official.transpose(0, 2, 3, 1).reshape(100, -1)))


def test_cifar10_bad_batch_and_download_failure(tmp_path, monkeypatch) -> None:
    import torchvision.datasets

    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    write_cifar(folder)
    with open(folder / "test_batch", "wb") as handle:
        pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, handle)
    with pytest.raises(DataSourceError, match=r"test_batch: b'data' is uint8 \(4, 100\) .*need uint8 \[N, 3072\]"):
        read_cifar_batch(folder / "test_batch")
    (folder / "data_batch_2").unlink()

    def fail(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fail)
    with pytest.raises(DataSourceError, match=r"CIFAR-10 could not be downloaded .*extract cifar-10-python.tar.gz"):
        load_source(DataParams(source="cifar10"), tmp_path, seed=0)


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize(("override", "expected"), [
    ({"data": {"source": "imagefolder"}}, "data.imagefolder.root is required"),
    ({"data": {"source": "waterbirds"}, "bias": {"protocol": "foreground"}}, "bias.protocol = foreground recolours grey digit strokes"),
    ({"data": {"source": "cifar10"}, "bias": {"protocol": "given"}}, "bias.protocol = given needs a bias attribute"),
    ({"model": {"name": "lenet5", "pretrained": True}}, "which name = lenet5 does not have; allowed: resnet18, resnet50"),
    ({"data": {"celeba": {"target": "Blonde_Hair"}}}, "did you mean 'Blond_Hair'"),
    ({"data": {"celeba": {"target": "Male"}}}, "both 'Male'"),
    ({"data": {"imagefolder": {"split_values": {"train": 0, "test": 2}}}}, "exactly train, val and test"),
    ({"data": {"imagefolder": {"label_column": "place"}}}, "name one column twice"),
    ({"bias": {"corruption": {"types": ["frost", "frost"]}}}, "at least two distinct corruptions"),
    ({"bias": {"corruption": {"types": ["fog", "frost"]}}}, "bias.corruption.types.0 = 'fog' is not allowed"),
    ({"bias": {"corruption": {"severity": 6}}}, "bias.corruption.severity = 6"),
])
def test_image_params_are_checked(override: dict, expected: str) -> None:
    with pytest.raises(ParamsError, match=expected):
        validate(override)
    assert validate({"data": {"source": "waterbirds"}, "bias": {"protocol": "given"},
                     "model": {"name": "resnet50", "pretrained": True}}).model.pretrained


# --------------------------------------------------------------------------- corruption protocol


def textures(folder) -> str:
    """Five fake frost photographs (bright speckles) under Hendrycks' file names."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for name in corruptions.FROST_FILES:
        Image.fromarray((rng.random((200, 240, 3)) ** 4 * 255).astype(np.uint8)).save(folder / name)
    return str(folder)


def cifar_like(n_per_class: int, size: int = 16, seed: int = 0) -> dict[str, RawSplit]:
    """Random RGB images (coarse blocks plus pixel noise) of 10 classes in three splits."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in ("train", "val", "test"):
        y = np.repeat(np.arange(10), n_per_class)
        coarse = rng.integers(30, 225, (len(y), 4, 4, 3)).repeat(size // 4, 1).repeat(size // 4, 2)
        out[name] = RawSplit((coarse + rng.integers(-25, 26, coarse.shape)).astype(np.uint8), y)
    return out


@pytest.fixture
def corruption_params(tmp_path) -> BiasParams:
    return BiasParams(protocol="corruption", corruption={"rho": 0.9, "frost_dir": textures(tmp_path / "frost")})


def test_corruption_counts_follow_lff_and_test_is_uniform(corruption_params) -> None:
    y = np.repeat(np.arange(10), 200)
    types = corruption_indices(y, 0.9, 10, np.random.default_rng(0))
    counts = np.zeros((10, 10), int)
    np.add.at(counts, (y, types), 1)
    off_diagonal = counts[~np.eye(10, dtype=bool)]
    assert (np.diag(counts) == 180).all() and set(off_diagonal.tolist()) == {2, 3}  # 20 over 9 types, rounded milestones
    assert (counts.sum(1) == 200).all()
    biased = inject_bias(cifar_like(40), corruption_params, seed=0)
    summary = summarise(biased, corruption_params)
    assert summary["splits"]["train"]["n_aligned"] == 360  # 0.9 of 40 per class
    for name in ("val", "test"):
        assert summary["splits"][name]["n_aligned"] == 40
        assert (biased[name].group_counts() == 4).all()  # 40 per class spread evenly over the ten types
    assert summary["target_correlation"]["train"] == 0.9 and summary["corruptions"]["severity"] == 4
    assert biased["train"].n_attrs == 10 and torch.equal(biased["train"].aligned, biased["train"].a == biased["train"].y)


def test_corruption_is_deterministic_in_the_seed(corruption_params) -> None:
    raw = cifar_like(6)
    first, again = inject_bias(raw, corruption_params, seed=0), inject_bias(raw, corruption_params, seed=0)
    other = inject_bias(raw, corruption_params, seed=1)
    assert all(torch.equal(first[n].x, again[n].x) and torch.equal(first[n].a, again[n].a) for n in first)
    assert not torch.equal(first["train"].x, other["train"].x)


@pytest.mark.parametrize("name", sorted(set(corruptions.CORRUPTIONS) - {"original"}) + ["frost"])
def test_every_corruption_changes_the_image_at_every_severity(name: str, tmp_path) -> None:
    images = torch.from_numpy(cifar_like(1, size=32)["train"].x).permute(0, 3, 1, 2).contiguous()
    fn = corruptions.resolve(name, textures(tmp_path / "frost"), 32, torch.device("cpu"))
    for severity in range(1, 6):
        out = corruptions.corrupt(images, fn, severity, torch.Generator().manual_seed(0), chunk=4)
        assert out.shape == images.shape and out.dtype == torch.uint8
        changed = (out != images).flatten(1).any(1)
        assert changed.all(), (name, severity)


def test_corruptions_match_their_reference_definitions() -> None:
    import colorsys

    from scipy import ndimage

    rng = np.random.default_rng(0)
    image = rng.random((32, 32, 3))
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    g = torch.Generator()
    blurred = ndimage.gaussian_filter(image, sigma=(0.8, 0.8, 0), mode="nearest", truncate=4.0)  # skimage's gaussian
    assert np.abs(corruptions.gaussian_blur(x, 4, g)[0].permute(1, 2, 0).numpy() - blurred).max() < 1e-5
    kernel = corruptions.disk_kernel(1.0, 0.2, x).double().numpy()
    defocus = np.stack([ndimage.correlate(image[..., c], kernel, mode="mirror") for c in range(3)], -1)  # cv2 filter2D
    assert np.abs(corruptions.defocus_blur(x, 4, g)[0].permute(1, 2, 0).numpy() - defocus).max() < 1e-5
    pixels = (image * 255).astype(np.uint8)
    pil = np.asarray(Image.fromarray(pixels).resize((24, 24), Image.Resampling.BOX)).astype(float)
    ours = corruptions.box_resize(torch.from_numpy(pixels).permute(2, 0, 1)[None].float(), 24, 24)
    assert np.abs(ours[0].permute(1, 2, 0).numpy() - pil).max() <= 1.0  # PIL rounds to uint8
    hsv = corruptions.rgb_to_hsv(x)[0].permute(1, 2, 0).reshape(-1, 3).numpy()
    assert np.allclose(hsv, [colorsys.rgb_to_hsv(*rgb) for rgb in image.reshape(-1, 3)], atol=1e-5)
    assert torch.allclose(corruptions.hsv_to_rgb(corruptions.rgb_to_hsv(x)), x, atol=1e-5)


def test_corruption_errors_name_the_fix(tmp_path, monkeypatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(BiasProtocolError, match="frost photographs .*bias.corruption.frost_dir.*pip install imagecorruptions"):
        inject_bias(cifar_like(2), BiasParams(protocol="corruption"), seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BiasProtocolError, match=r"frost photographs \['frost1.png'.* are not in .*empty"):
        inject_bias(cifar_like(2), BiasParams(protocol="corruption", corruption={"frost_dir": str(empty)}), seed=0)
    with pytest.raises(BiasProtocolError, match="2 corruption types .* for 10 classes"):
        inject_bias(cifar_like(2), BiasParams(protocol="corruption", corruption={"types": ["contrast", "pixelate"]}), seed=0)


def test_celeba_partition_listing_an_image_twice_is_refused(tmp_path, monkeypatch) -> None:
    """The neighbour of an image folder's repeated rows: CelebA's partition list naming an image in two partitions."""
    folder = tmp_path / "celeba" / "celeba"
    write_celeba(folder)
    no_network(monkeypatch)
    partition = folder / "list_eval_partition.txt"
    partition.write_text(partition.read_text() + "000001.jpg 2\n")  # train already
    with pytest.raises(DataSourceError, match=r"list_eval_partition.txt lists 1 image\(s\) more than once in column "
                                              r"'image': .*000001.jpg \(rows 0, 30\)"):
        load_source(DataParams(source="celeba", image_size=16), tmp_path, seed=0)


@pytest.mark.parametrize("flags, name", [([], "shapes"), (["--no-attribute"], "plain"), ([], "my shapes 'v2'")])
def test_example_folder_prints_a_next_command_that_passes_check_params(tmp_path, capsys, flags, name) -> None:
    """The `dvc exp run -S ...` example-folder prints is checked against the committed params.yaml as check-params
    checks it: it must validate (without bias labels it needs a label-free selection rule), and a shell reads the
    folder's path as one argument, spaces and quotes included."""
    import shlex

    from debias.tools.cli import main as cli_main
    from tests.conftest import committed_text

    root = tmp_path / name
    assert cli_main(["example-folder", str(root), "--n-train", "8", "--n-eval", "4", *flags]) == 0
    printed = capsys.readouterr().out
    command = shlex.split(printed.split("run: ", 1)[1])
    assert command[:3] == ["dvc", "exp", "run"]
    from debias.tools.overrides import override_files

    committed = tmp_path / "committed.yaml"
    committed.write_text(committed_text("params.yaml"))
    with override_files(committed, command[4::2]) as results:
        ((_, applied),) = results
        assert yaml.safe_load(applied.read_text())["data"]["imagefolder"]["root"] == str(root)  # as DVC writes it
    params = tmp_path / "params.yaml"
    params.write_text(committed_text("params.yaml"))
    sets = [f"-S{value}" for flag, value in zip(command[3::2], command[4::2]) if flag == "-S"]
    assert len(sets) == (len(command) - 3) // 2
    assert cli_main(["check-params", str(params), *[a for s in sets for a in ("-S", s[2:])]]) == 0, capsys.readouterr()

"""Where every parameter's default comes from: one line per leaf of the params schema (src/debias/params/ and the sections the registries declare).

A method's own section carries its sources in the method's declaration: a stage-2 method's (``stage2.cnc``, ...:
``register_method(..., sources=...)``, src/debias/training/methods/), a group-inference method's (``groups.cluster``,
...: ``register_group_method``, src/debias/groups/methods/), a probe variant's (``probe.dfr``: ``register_probe``,
src/debias/evaluation/probes/); :data:`SOURCES` adds them below.

Each source starts with its kind: ``paper:`` (a paper's table or section), ``code:`` (an official code file) or
``ours:`` (this project's choice, with the measured reason or, for a setting that cannot change a result, why).
A line quotes its key's value only in these forms, and tests/test_param_sources.py compares each with the schema's
default and the committed params.yaml: ``(default X)`` (or ``; default X``) where params.yaml keeps the schema's
default, ``schema default X`` and ``params.yaml Y`` where params.yaml states another value (the line must then name
both). Every number and boolean quotes its value so; other numbers in a line (another dataset's, another rho's) are
the paper's, not the default. The test also walks the schema and fails naming every param without a line here
(and every line naming no param), so a new param cannot land without its source. The papers' presets
(src/debias/tools/presets) carry their own per-value sources.

Papers: CNC = Zhang et al. 2022, Correct-N-Contrast (App. D); FairKL = Barbano et al. 2023, Unbiased Supervised
Contrastive Learning (App. B); WCL = difficulty-based sampling for debiased contrastive learning (CVPR 2023, Sec. 6);
DFR = Kirichenko et al. 2022; LfF = Nam et al. 2020; GroupDRO = Sagawa et al. 2020; JTT = Liu et al. 2021;
SimCLR = Chen et al. 2020; SCARF = Bahri et al. 2022; DCL = Chuang et al. 2020; HCL = Robinson et al. 2021.
"""

from __future__ import annotations

KINDS = ("paper: ", "code: ", "ours: ")

SOURCES: dict[str, str] = {
    "seed": "ours: any fixed seed (default 0); quality claims rest on >= 3 seeds (benchmarks/quality.py --seeds 0 1 2)",
    # ----------------------------------------------------------------------------------------------- data
    "data.source": "ours: digits (bundled with scikit-learn) so that `dvc repro` runs offline in minutes; the papers' "
                   "sources are the presets' (src/debias/tools/presets)",
    "data.path": "ours: a file / folder only the user can name (null: none)",
    "data.val_fraction": "ours: a 15 % stratified validation split of the small sources (digits, npz) (default 0.15), "
                         "the share WCL Sec. 6.2 uses for its random splits",
    "data.test_fraction": "ours: a 25 % stratified test split of the small sources (digits, npz) (default 0.25), "
                          "larger than validation because the reported numbers come from it",
    "data.mnist_val_size": "ours: 6,000 of MNIST's 60k training images (default 6000: 54k / 6k); CNC App. D.1 uses 80 "
                           "/ 20 % (12,000: preset cnc-cmnist)",
    "data.image_size": "paper: 28 for MNIST (default 28; Bahng et al. / FairKL App. B.2.1, CNC App. D.1); the presets "
                       "set 32 (FairKL App. B.2.2) and 224 (CNC App. D.2.2, FairKL's bFFHQ code)",
    "data.max_per_split": "ours: no cap (null); a cap is for smoke runs only",
    "data.max_train": "ours: no cap (null); a cap is for scaling runs (benchmarks/scale.py)",
    "data.memory_gb": "ours: null = the memory available when loading (a guard, no effect on results)",
    "data.imagefolder.root": "ours: a folder only the user can name (null: none)",
    "data.imagefolder.metadata": "code: GroupDRO / WILDS Waterbirds layout (metadata.csv)",
    "data.imagefolder.path_column": "code: GroupDRO / WILDS Waterbirds metadata.csv column img_filename",
    "data.imagefolder.label_column": "code: GroupDRO / WILDS Waterbirds metadata.csv column y",
    "data.imagefolder.attribute_column": "code: GroupDRO / WILDS Waterbirds metadata.csv column place",
    "data.imagefolder.split_column": "code: GroupDRO / WILDS Waterbirds metadata.csv column split",
    "data.imagefolder.split_values": "code: GroupDRO / WILDS Waterbirds split coding 0 / 1 / 2",
    "data.imagefolder.label_values": "ours: null (integer labels as Waterbirds' metadata.csv holds them)",
    "data.imagefolder.attribute_values": "ours: null (integer attributes as Waterbirds' metadata.csv holds them)",
    "data.imagefolder.fit": "code: GroupDRO's Waterbirds transform (the whole image resized)",
    "data.imagefolder.crop_fraction": "ours: no crop (default 1) for a folder of unknown images",
    "data.waterbirds.url": "code: GroupDRO's README (the archive CNC and JTT use)",
    "data.waterbirds.fit": "code: GroupDRO / CNC Waterbirds transform Resize((256, 256)) then CenterCrop(224)",
    "data.waterbirds.crop_fraction": "code: GroupDRO / CNC Waterbirds transform: 224 / 256 (default 0.875)",
    "data.celeba.target": "paper: CNC App. D.1 / GroupDRO: Blond_Hair",
    "data.celeba.attribute": "paper: CNC App. D.1 / GroupDRO: Male",
    "data.celeba.fit": "code: GroupDRO / CNC CelebA transform CenterCrop(178) then Resize(224)",
    "data.celeba.crop_fraction": "code: GroupDRO / CNC CelebA transform: no further crop after the central square "
                                 "(default 1)",
    "data.cifar10.val_size": "ours: 5,000 of CIFAR-10's 50k training images (default 5000: 10 %, 500 per class) for "
                             "selection; FairKL states no validation split",
    "data.tabular.val_fraction": "paper: WCL Sec. 6.2: 70 / 15 / 15 % random splits (default 0.15)",
    "data.tabular.test_fraction": "paper: WCL Sec. 6.2: 70 / 15 / 15 % random splits (default 0.15)",
    "data.tabular.keep_sensitive_feature": "ours: the sensitive attribute stays an input feature (default true), the "
                                           "usual setting of the Adult / COMPAS fairness benchmarks (WCL Table 3 does "
                                           "not say)",
    "data.tabular.verify_sha256": "ours: the published files' sha256 are checked (default true; UCI adult.data / "
                                  "adult.test, ProPublica compas-scores-two-years.csv): a file truncated at a line "
                                  "boundary is refused",
    "data.tabular.compas_races": "ours: African-American and Caucasian, COMPAS's two largest groups (the binary race "
                                 "attribute of the fairness literature; WCL Sec. 6.2 says race)",
    # ----------------------------------------------------------------------------------------------- bias
    "bias.protocol": "ours: auto = each source's own protocol (foreground for digits: CNC App. D.1; corruption for "
                     "cifar10: FairKL Table 4; given where the data carry an attribute)",
    "bias.max_uncolourable": "ours: 1 % of a split (default 0.01) may fail to show the colour before inject_bias "
                             "refuses (a guard against a meaningless bias; no effect on valid data)",
    "bias.foreground.p_corr": "paper: CNC App. D.1 (schema default 0.995); params.yaml 0.9 (ours: on the 1,078 "
                              "training digits it gives 100 bias-conflicting images, params.yaml comment)",
    "bias.foreground.stroke_threshold": "ours: grey level 120 of 255 (default 120), about the middle of MNIST's "
                                        "0..255 range: pixels from it on are the stroke that takes the colour (not "
                                        "tuned)",
    "bias.foreground.class_digits": "paper: CNC App. D.1: (0,1) (2,3) (4,5) (6,7) (8,9)",
    "bias.foreground.colours": "code: CNC's code (matplotlib hsv at 0, .2, .4, .6, .8; params/bias.py FOREGROUND_COLOURS)",
    "bias.background.rho": "paper: FairKL Table 3: 0.99 ... 0.999 (default 0.99, the mildest; presets fairkl-bmnist-*)",
    "bias.background.eval_rho": "code: FairKL debiasing/main_infonce.py: test set data_label_correlation=0.1, uniform "
                                "(default 0.1)",
    "bias.background.colours": "code: Bahng et al. (rebias) Biased-MNIST palette (params/bias.py BACKGROUND_COLOURS); "
                               "the fairkl-bmnist presets set class 9 to the released FairKL code's (50, 255, 128)",
    "bias.corruption.rho": "paper: FairKL Table 4 ratios 0.5 / 1 / 2 / 5 % -> rho 0.995 / 0.99 / 0.98 / 0.95 (default "
                           "0.99)",
    "bias.corruption.eval_rho": "paper: FairKL Table 4 / DFA: unbiased test, uniform over the ten corruptions "
                                "(default 0.1)",
    "bias.corruption.types": "code: DFA's ten corruptions (Lee et al. 2021), the data of FairKL Table 4",
    "bias.corruption.severity": "code: LfF's code applies its SeverityK as Hendrycks' level K + 1 (default 4; "
                                "params.yaml comment)",
    "bias.corruption.frost_dir": "code: Hendrycks' frost images as packaged in imagecorruptions (null: those)",
    # ----------------------------------------------------------------------------------------------- model
    "model.name": "paper: CNC App. D.2.2: LeNet-5 on CMNIST* (FairKL's SimpleConvNet, ResNets and the MLP through the "
                  "presets)",
    "model.pretrained": "paper: CNC App. D.2.2: ImageNet weights for ResNet-50 only (default false for the others)",
    "model.feature_activation": "code: FairKL's encoder without a projection head ends in tanh (default auto: tanh "
                                "for the supcon family, relu for the others; a ReLU feature layer keeps every "
                                "normalised z in the positive orthant, so no two samples are pushed more than 90 "
                                "degrees apart); relu against tanh on the default data: not in a results file",
    "model.stem": "ours: auto (default auto): the CIFAR stem (3x3 stride 1, no max-pool) from scratch at <= 64 px, "
                  "torchvision's ImageNet stem otherwise and with pretrained weights. The FairKL Corrupted CIFAR-10 / "
                  "bFFHQ presets set imagenet: code: FairKL debiasing/main_infonce.py load_model swaps the first "
                  "convolution for cifar10 / cifar100 only (and keeps the max-pool there)",
    "model.normalization": "code: FairKL debiasing/main_infonce.py normalises Biased-MNIST with 0.5 / 0.5 (default "
                           "auto: half, ImageNet's with pretrained weights as torchvision's transforms); the FairKL "
                           "Corrupted CIFAR-10 / bFFHQ presets set cifar10, the statistics that file uses there",
    "model.mlp.hidden": "code: LfF's MLP (alinlab/LfF module/mlp.py: 3 x 100)",
    "model.mlp.batch_norm": "paper: WCL Sec. 6.2: MLP with ReLU followed by batch normalization (default true)",
    # ----------------------------------------------------------------------------------------------- erm
    "erm.optimizer": "paper: CNC App. D.2.2: SGD",
    "erm.lr": "paper: CNC App. D.2.2 (schema default 1e-3); params.yaml 0.01 (ours: on ~1k digits 1e-3 for 5 epochs "
              "is 170 steps and stays at chance; 0.01 for 10 epochs trains, params.yaml comment)",
    "erm.momentum": "paper: CNC App. D.2.2 (default 0.9)",
    "erm.weight_decay": "paper: CNC App. D.2.2 (default 5e-4)",
    "erm.batch_size": "paper: CNC App. D.2.2 (default 32)",
    "erm.epochs": "paper: CNC App. D.2.2: E = 5 (schema default 5); params.yaml 10 (ours: see erm.lr)",
    "erm.lr_milestones": "paper: CNC App. D.2.2 (constant learning rate)",
    "erm.lr_gamma": "paper: FairKL App. B.2.1: x0.1 at each milestone (default 0.1; no milestone by default)",
    "erm.selection": "paper: CNC App. D.2.2 trains a fixed few epochs (last); the label-free choice "
                     "best_worst_class: SubpopBench (Yang et al., ICML 2023, Change is Hard: its model-selection "
                     "study takes worst-class validation accuracy when attributes are unknown)",
    "erm.eval_batch_size": "ours: 1024 images per evaluation batch (default 1024; memory only, no effect on results)",
    "erm.augment_shift": "code: CNC's code trains on random crops (schema default 0: off); params.yaml 2 (ours: a "
                         "random shift of up to 2 px; not measured against 0)",
    # ----------------------------------------------------------------------------------------------- groups
    "erm.step": "ours: eager (default), the only path on the CPU; ERM's split step measured against the unsplit one "
                "(unsplit / split 0.945 steps/s, 0.954 steps per CPU-second), inside the run's own spread "
                "(benchmarks/results/captured_step.md); "
                "cuda_graph not measured on a GPU",
    "groups.method": "paper: CNC App. D.2.3 (schema default pred; clusters chosen for all datasets in D.2.4); "
                     "params.yaml cluster (ours: the tool's card, README)",
    # ----------------------------------------------------------------------------------------------- stage 2
    "stage2.optimizer": "paper: CNC App. D.2.4 (schema default sgd); params.yaml adam (FairKL App. B.2.1; ours for CNC: "
                        "CNC's own SGD schedule, 32 batches per step, measured 46.2 [20.4, 72.0] points of validation "
                        "unbiased accuracy on clusters, row `cnc-paper-cluster-replace-e0` of "
                        "benchmarks/results/default_search_d1b5879.md; the cnc-* presets set SGD)",
    "stage2.lr": "paper: CNC App. D.2.4 and FairKL App. B.2.1 (default 1e-3)",
    "stage2.momentum": "paper: CNC App. D.2.4 (default 0.9; unused by Adam)",
    "stage2.weight_decay": "paper: CNC App. D.2.4 (default 1e-4; the default schedule measured in "
                           "benchmarks/results/default_search.md)",
    "stage2.batch_size": "paper: CNC App. D.2.4's batch is 2M + 2N, its ERM's 32 (schema default 32); params.yaml 256 "
                         "(FairKL App. B.2.1; WCL Sec. 6.1: 128)",
    "stage2.epochs": "paper: CNC App. D.2.4 (default 3), each over stage2.cnc.anchor_fraction of the anchors (the "
                     "default schedule measured in benchmarks/results/default_search.md)",
    "stage2.lr_milestones": "ours: none in the default's 3 epochs (FairKL App. B.2.1's 26 and 53 of 80 in the "
                            "fairkl-bmnist presets)",
    "stage2.lr_gamma": "paper: FairKL App. B.2.1: x0.1 (default 0.1)",
    "stage2.selection": "paper: CNC App. D.2.4: early stopping on validation worst-group accuracy (schema default "
                        "best_worst_group); ours: params.yaml best_unbiased (every validation image counts; its "
                        "degenerate selections and numbers against best_worst_group's measured on the default's "
                        "held-out runs, benchmarks/results/default_search.md, selection rules table); the label-free "
                        "choices: best_worst_class after SubpopBench (Yang et al., ICML 2023, Change is Hard: "
                        "worst-class validation accuracy when attributes are unknown), best_worst_inferred_group ours "
                        "(the worst-group rule on the validation groups inferred as the training split's)",
    "stage2.eval_batch_size": "ours: 1024 images per evaluation batch (default 1024; memory only, no effect on "
                              "results)",
    "stage2.augment_shift": "code: FairKL debiasing/main_infonce.py: no augmentation on Biased-MNIST (schema default "
                            "0); params.yaml 2 (the default CNC schedule measured in "
                            "benchmarks/results/default_search.md; CNC's code trains on random crops)",
    "stage2.method": "paper: CNC (default cnc); chosen on validation, measured in benchmarks/results/default_search.md "
                     "(CNC ahead of the released FairKL objective in each of its three regimes)",
    "stage2.head.weight_decay": "ours: 1e-4 L2 on the per-epoch linear head (default 1e-4), scikit-learn's C = 1 "
                                "ridge order (not tuned); FairKL trains its linear classifier separately too (App. "
                                "B.2)",
    "stage2.head.max_iter": "code: scikit-learn LogisticRegression's own max_iter: 100 L-BFGS iterations (default 100)",
    "stage2.head.warm_start": "ours: the previous epoch's head as the start (default true); measured on the default "
                              "data, 3 seeds: the same selected epoch and accuracies as a cold start in fewer L-BFGS "
                              "iterations (908, 1,018, 890 against 1,098, 1,200, 1,082: "
                              "benchmarks/results/head_warm_start.md)",
    "stage2.head.features": "ours: raw (default raw: z as the linear probe reads it); the released FairKL code's "
                            "classifier reads z / |z| (debiasing/models/simpleconvnet.py and resnet.py, "
                            "train_on_head=True): the fairkl-* presets set unit",
    "stage2.head.tolerance": "code: torch.optim.LBFGS's own tolerance_grad (default 1e-7); looser values changed the "
                             "selected epoch on the default data (measured: benchmarks/results/head_warm_start.md)",
    "stage2.speed.autocast": "ours: none (off) until measured on CPU and GPU: bf16 gave 1.27x steps/s on the CPU, "
                             "accuracy and GPU not measured (benchmarks/results/speed_settings.md)",
    "stage2.speed.compile": "ours: off (default false): torch.compile measured 0.99x steps/s on the CPU "
                            "(benchmarks/results/speed_settings_compile.md); GPU not measured",
    "stage2.speed.channels_last": "ours: off (default false): channels-last measured 0.95x steps/s on the CPU "
                                  "(benchmarks/results/speed_settings.md); GPU not measured",
    "stage2.speed.step": "ours: eager (default), the only path on the CPU; the eager step split for capture measured "
                         "as fast as the unsplit one on the CPU's stage 2 (eps-SupInfoNCE + FairKL, unsplit / split "
                         "0.957 steps/s, 0.999 steps per CPU-second; benchmarks/results/captured_step.md); cuda_graph "
                         "not measured on a GPU",
    "stage2.tabular_view.corruption_rate": "paper: SCARF: corruption rate (default 0.6)",
    # ----------------------------------------------------------------------------------------------- loss
    "loss.temperature": "paper: SupCon / FairKL (default 0.1; FairKL debiasing/main_infonce.py --temp 0.1)",
    "loss.epsilon": "paper: CNC Eq. 15 has no margin (default 0: CNC's loss, and eps-SupInfoNCE's limit); FairKL Table "
                    "6: 0.5 for eps-SupInfoNCE at every rho (the fairkl-bmnist-*-eps-supinfonce presets)",
    "loss.alpha": "paper: FairKL Eq. 11 with the kl variant (schema default 1.0); params.yaml 0.03: FairKL Table 6's, "
                  "in the released objective (which applies it squared), measured the best of the supcon family in "
                  "benchmarks/results/default_choice.md (12 cells); there the eps term weighs "
                  "`0.03^2 * 0.1 / 0.07 = 0.0013` against lambda 0.5 (negligible-param)",
    "loss.eps_supcon.epsilon": "paper: FairKL Table 6: eps-SupCon's eps 0.25 / 0 / 0.5 / 0 at rho 0.999 / 0.997 / "
                               "0.995 / 0.99; rho 0.99's (default 0), the column nearest the default data's weaker "
                               "bias (the presets fairkl-bmnist-*-eps-supcon set each rho's); not measured on the "
                               "default data",
    "loss.eps_supcon.fairkl_weight": "paper: FairKL Table 6: eps-SupCon's lambda 0.75 / 0.5 / 0.5 / 0.5 at rho 0.999 "
                                     "/ 0.997 / 0.995 / 0.99 (schema default 0: FairKL off); params.yaml 0.5 (rho "
                                     "0.99's, as loss.fairkl.weight; not measured on the default data)",
    "loss.fairkl.weight": "paper: FairKL Table 6: lambda 0.75 for eps-SupInfoNCE at rho 0.995-0.999, 0.5 at rho 0.99 "
                          "(schema default 0: off, the plain losses); params.yaml 0.5 (rho 0.99's, the column nearest "
                          "the default data's weaker bias; ours: measured on validation with kl at alpha 1, lambda 0.5 "
                          "and 0.75 gave 41.3 and 37.9 % worst-group, 3 seeds, benchmarks/results/eps_sweep.md)",
    "loss.fairkl.variant": "paper: FairKL Eq. 10 (schema default kl); params.yaml released: the code behind the "
                           "paper's tables (debiasing/main_infonce.py; the loss is tested equal to that code's, no run "
                           "here reproduces a FairKL table), the best objective measured in "
                           "benchmarks/results/default_choice.md; also set by the fairkl-* presets",
    "loss.fairkl.variance_floor": "ours: 1e-6 squared-distance units (default 1e-6; unit vectors lie 0..4 apart): far "
                                  "below any spread of real distances, it keeps Eq. 10's Gaussian KL finite on a pair "
                                  "set of equal distances",
    "loss.fairkl.sampler": "paper: FairKL: plain shuffled batches (shuffle)",
    "loss.fairkl.minority_per_batch": "ours: 16 inferred-minority points per batch of 256 (default 16; stratified "
                                      "sampler only) keep FairKL's four pair sets non-empty",
    # ----------------------------------------------------------------------------------------------- probe
    "probe.train_split": "paper: FairKL App. B.2 / WCL Sec. 6.1: a linear classifier trained on the training features",
    "probe.c_grid": "ours: four decades of L2 strength around scikit-learn's C = 1, the best validation worst-group "
                    "wins (selection on validation only)",
    "probe.max_iter": "ours: a cap of 1000 iterations (default 1000), 10x scikit-learn's own 100 (not tuned)",
    "probe.standardize": "ours: standardised features (default true; scikit-learn's advice for L2-regularised "
                         "logistic regression)",
    "probe.method": "paper: WCL Sec. 6.1: linear probing (logistic)",
    "probe.postprocess": "paper: WCL Table 3's Eq. Odds row (Hardt et al. 2016) is opt-in (none)",
    # ----------------------------------------------------------------------------------------------- evaluate
    "evaluate.splits": "ours: test (reported) and val (what selection saw)",
    "evaluate.normalize_alignment": "paper: CNC Eq. 2-3 on raw encoder outputs (default false)",
    "evaluate.block_size": "ours: 2048 rows per tile of pairwise distances (default 2048; memory only, no effect on "
                           "results)",
    "evaluate.max_pair_points": "ours: 20,000 rows bound the O(n^2) pairwise metrics (default 20000); val / test (6k "
                                "/ 10k) are never cut (params.yaml comment)",
    "evaluate.umap.neighbors": "code: umap-learn's own n_neighbors (default 15)",
    "evaluate.umap.min_dist": "code: umap-learn's own min_dist (default 0.1)",
    "evaluate.umap.max_points": "ours: 2,000 points per UMAP figure (default 2000; display only)",
    "evaluate.mi_max_iter": "code: CNC activations.py compute_activation_mi: LogisticRegression(max_iter=1000) "
                            "(default 1000)",
    "evaluate.mi_c": "code: CNC activations.py compute_activation_mi sets no C: scikit-learn's own (default 1), "
                     "fitted on half of the embeddings and evaluated on the other (App. D.2.1's Eq. 16 names the "
                     "logistic regression only)",
    # ----------------------------------------------------------------------------------------------- report
    "report.title": "ours: the report's heading (display only, no effect on results)",
    "report.paper_numbers": "ours: the papers' numbers beside ours where the protocol matches (default true; display "
                            "only)",
    "report.dpi": "ours: figure resolution (default 110; display only)",
    "report.confidence": "ours: the conventional 95 % level of the Wilson intervals on group accuracies (default "
                         "0.95; display only)",
    "report.min_group_n": "ours: the usual n >= 30 rule of thumb for a binomial proportion (default 30); a smaller "
                          "worst group is marked, not hidden (display only)",
    # ----------------------------------------------------------------------------------------------- health
    "health.loss_spike": "ours: an eps-SupInfoNCE + FairKL run's stage-2 loss on the default data rose by 31 % and "
                         "27 % of its fall at epochs 14 and 16 "
                         "(its other rises <= 1 %): 0.25 flags those and not the noise (default 0.25)",
    "health.loss_end": "ours: 0.25 of the fall above the minimum at the last epoch (default 0.25), the spike "
                       "threshold's scale",
    "health.loss_min_fall": "ours: judged only once the loss fell by 10 % of |first epoch's loss| (default 0.1; "
                            "before that a rise is not instability after converging)",
}


def _method_sources() -> dict[str, str]:
    from debias.evaluation.variants import probe_sources
    from debias.groups.registry import group_sources
    from debias.training.methods.registry import method_sources

    return {**group_sources(), **method_sources(), **probe_sources()}


SOURCES.update(_method_sources())

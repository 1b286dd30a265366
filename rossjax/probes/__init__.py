"""PROPEL probes: activations of a frozen reference model -> small heads that predict whether a
task lands in the solver's learnable band.

    acts = rossjax.probes.extract(cfg, params, token_lists, layers=(8,), pooling="mean")
    probe = rossjax.probes.train_probe(x_train, y_train, x_val, y_val, TrainConfig(head="mlp"))

Submodules: labels (U_S from solver trials), activations (extraction), store (tensorstore),
heads (linear/MLP heads and their training), metrics, sweep (`rossjax probe-sweep`).
"""

from rossjax.probes.activations import extract, iter_extract
from rossjax.probes.heads import HEADS, Probe, TrainConfig, group_kfold, random_split, train_probe
from rossjax.probes.labels import Labels, align_labels, read_label_file, utility_labels
from rossjax.probes.store import ActivationStore, open_store, write_store

__all__ = ["extract", "iter_extract", "open_store", "write_store", "HEADS", "Probe", "TrainConfig",
           "train_probe", "random_split", "group_kfold", "Labels", "utility_labels",
           "read_label_file", "align_labels", "ActivationStore"]

"""Data sets and their split across nodes (ARCHITECTURE.md, ``dpdl.data``).

``load_dataset(name, data_dir=None, download=False, seed=0)`` returns a :class:`Dataset`
for "digits", "breast-cancer", "diabetes" (scikit-learn, no download), "fashion-mnist"
(IDX files), "cifar10" (python pickle batches) or "csv:<path>".
``partition`` splits record indices over nodes; ``stack_node_data`` pads them into stacked
(n, J_max, ...) arrays with a validity mask for the simulator; ``held_out_mask`` picks the
records ``training.node_eval_share`` holds out of a node (a keyed hash of each record);
``validation_split`` the records ``data.validation_records`` holds out of the training split
(by a keyed hash, never the seed).  ``label_histograms`` and ``plot_label_distribution``
describe how heterogeneous the nodes' labels are (statistics of private records: for the data
owner to compute locally).
"""

from dpdl.data.cifar10 import download_cifar10, find_cifar10, load_cifar10, read_batch
from dpdl.data.csv_loader import load_csv
from dpdl.data.dataset import Dataset
from dpdl.data.fashion_mnist import find_fashion_mnist, load_fashion_mnist
from dpdl.data.heterogeneity import label_histograms, plot_label_distribution
from dpdl.data.idx import parse_idx, read_idx, write_idx
from dpdl.data.nodes import local_arrays, read_records, stack_local_datasets
from dpdl.data.partition import (
    SCHEMES,
    held_out_mask,
    label_distribution,
    partition,
    stack_node_data,
)
from dpdl.data.registry import dataset_names, is_public_benchmark, load_dataset, register_loader
from dpdl.data.sklearn_sets import load_breast_cancer, load_diabetes, load_digits
from dpdl.data.validation import VALIDATION_KEY, validation_split

__all__ = [
    "SCHEMES",
    "VALIDATION_KEY",
    "Dataset",
    "dataset_names",
    "download_cifar10",
    "find_cifar10",
    "find_fashion_mnist",
    "held_out_mask",
    "is_public_benchmark",
    "label_distribution",
    "label_histograms",
    "load_breast_cancer",
    "load_cifar10",
    "load_csv",
    "load_dataset",
    "load_diabetes",
    "load_digits",
    "load_fashion_mnist",
    "local_arrays",
    "parse_idx",
    "partition",
    "plot_label_distribution",
    "read_batch",
    "read_records",
    "read_idx",
    "register_loader",
    "stack_node_data",
    "stack_local_datasets",
    "validation_split",
    "write_idx",
]

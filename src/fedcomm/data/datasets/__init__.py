"""The datasets: offline loaders for standard on-disk formats, one module per dataset or format
family, and their registry.

Nothing here downloads anything: every dataset but ``digits`` and ``synthetic`` is read from a
data root (``data.root`` in ``params.yaml`` or ``$FEDCOMM_DATA_ROOT``) in its original format,
and a missing one raises :class:`DatasetNotFoundError` naming the files to put where. Loaders pool
the official train and test splits into one :class:`Dataset`, train first.

========================  ===================================================================
name                      files under the data root
========================  ===================================================================
``digits``                none (scikit-learn's bundled 8x8 digits)
``mnist``                 4 IDX files (``.gz`` or plain) in ``mnist/``, ``MNIST/raw/`` or ``./``
``fashion_mnist``         4 IDX files in ``fashion_mnist/`` or ``FashionMNIST/raw/``
``femnist``               LEAF JSON ``leaf/femnist/{train,test}/*.json[.gz]`` (or ``femnist/``)
``shakespeare``           LEAF JSON ``shakespeare/{train,test}/*.json[.gz]`` or
                          ``shakespeare/roles.jsonl.gz``
``ptb``                   ``ptb/ptb.{train,valid,test}.txt`` (or in ``./``), any present
``cifar10``/``cifar100``  python pickles in ``cifar-10-batches-py/`` / ``cifar-100-python/``
``image_folder``          ``<path>/{train,test}/<class>/<image>`` (torchvision's ImageFolder;
                          decoded once, cached by content)
``synthetic``             none (FedProx Synthetic(alpha, beta))
========================  ===================================================================


Modules: :mod:`.registry` (name -> loader, the data root, :func:`load_dataset`),
:mod:`.verify` (missing and damaged files: errors naming the file and the remedy, digest
checks), :mod:`.options` (a loader's options), :mod:`.text` (windows and vocabularies), and one
module per dataset or format: :mod:`.digits`, :mod:`.synthetic`, :mod:`.mnist` (IDX),
:mod:`.leaf` (LEAF JSON) with :mod:`.femnist` and :mod:`.shakespeare`, :mod:`.ptb`,
:mod:`.cifar` and :mod:`.image_folder` (with :mod:`.image_files` and :mod:`.image_cache`). Each
module says what it checks and which standard release ``verify`` compares with.

Damaged files: a dataset file that is present but empty, truncated, corrupted or of another
format or version raises :class:`DatasetFileError`, whose one-line message names the file, what is
wrong and the remedy (a fresh copy; see ``docs/configuration.md``); gzip's CRC catches
corruption of ``.gz`` files. Option ``verify`` (default ``true``; ``mnist``, ``fashion_mnist``,
``ptb``, ``cifar10``, ``cifar100``, ``image_folder``) also compares a file of a standard
release's size with that release; ``verify: false`` accepts a user's own copy. Unknown option
names raise ``ValueError`` (catches typos).

Importing the package registers every loader (the imports below, in registration order).
"""

from __future__ import annotations

# isort: off
from fedcomm.data.datasets import digits, synthetic, mnist, femnist, shakespeare, ptb  # noqa: F401
from fedcomm.data.datasets import cifar, image_folder  # noqa: F401

# isort: on
from fedcomm.data.datasets.mnist import read_idx
from fedcomm.data.datasets.registry import DATASETS, Loader, load_dataset, register, resolve_root
from fedcomm.data.datasets.verify import DATA_ROOT_ENV, DatasetFileError, DatasetNotFoundError

__all__ = [
    "DATASETS",
    "DATA_ROOT_ENV",
    "DatasetFileError",
    "DatasetNotFoundError",
    "Loader",
    "load_dataset",
    "read_idx",
    "register",
    "resolve_root",
]

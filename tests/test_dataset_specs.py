"""Typed dataset specs: every registry entry reads into its kind's spec and the shared
preprocessing spec, with values cast and defaults in one place."""

from __future__ import annotations

from dataclasses import fields

import pytest

from topkbench.cli.app import conf_dir
from topkbench.config import DatasetConfig
from topkbench.config_keys import DATASET_KEYS
from topkbench.data.registry import registry_entry, registry_names
from topkbench.dataset_specs import ALL_KINDS, PreprocessSpec, kind_spec


@pytest.mark.parametrize("name", registry_names(conf_dir()))
def test_registry_entries_read_into_typed_specs(name):
    cfg = registry_entry(conf_dir(), name)
    spec, pre = cfg.spec, cfg.preprocess
    assert isinstance(spec, ALL_KINDS[cfg.kind])
    assert isinstance(pre, PreprocessSpec)
    for f in fields(spec):
        if f.name in dict(cfg.options):
            assert getattr(spec, f.name) == dict(cfg.options)[f.name]


def test_values_are_cast_and_defaults_kept():
    cfg = DatasetConfig.from_dict(
        {"kind": "gaussian", "n_classes": 5, "separation": 2, "bias": 1, "pca": 7}
    )
    assert cfg.spec.n_classes == 5 and cfg.spec.n_train == 10_500
    assert isinstance(cfg.spec.separation, float) and cfg.spec.separation == 2.0
    assert cfg.preprocess == PreprocessSpec(pca=7, bias=1.0)
    assert kind_spec("mulan", {"n_labels": -6}).n_labels == -6
    assert kind_spec("mulan", {}).n_labels is None
    assert kind_spec("libsvm", {"zero_based": True, "n_labels": 3}).zero_based is True


def test_every_spec_field_is_a_valid_dataset_key():
    for cls in (*ALL_KINDS.values(), PreprocessSpec):
        assert {f.name for f in fields(cls)} <= DATASET_KEYS


@pytest.mark.parametrize("bad", [0, 0.95, "half", True])
def test_pca_must_be_a_component_count_or_nonsingular(bad):
    from topkbench.errors import ConfigError

    with pytest.raises(ConfigError, match="dataset.pca must be a number of components"):
        DatasetConfig.from_dict({"kind": "libsvm", "pca": bad})

"""Tests for :class:`delayindex.TrackerConfig`: defaults, immutability and validation."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import pytest

from delayindex import TrackerConfig
from delayindex.config import TrackerConfig as ConfigFromModule

DEFAULTS = {
    "tick_ms": 1000,
    "strict": False,
    "min_index_count_per_bucket": 50_000,
    "max_time_step_per_segment_ms": 300_000,
    "max_indexes_per_segment": 5_000,
    "max_num_buckets": 50,
    "fixed_delay_lookahead": 50_000,
    "pause_on_unpersisted": False,
    "max_unpersisted_indexes": 1_000_000,
    "max_delete_attempts": 10,
    "delete_retry_delay_ms": 60_000,
    "group_commit_max_ops": 512,
    "group_commit_max_bytes": 4 * 1024 * 1024,
    "group_commit_max_delay_ms": 1,
    "load_retry_delay_ms": 1000,
    "due_log_memory_keys": 16_384,
}
BOOL_FIELDS = ("strict", "pause_on_unpersisted")
INT_FIELDS = tuple(name for name in DEFAULTS if name not in BOOL_FIELDS)


def _names(field: str) -> str:
    """A regex matching the field name as a whole word in an error message."""
    return rf"(?<![A-Za-z0-9_]){re.escape(field)}(?![A-Za-z0-9_])"


# --- defaults ----------------------------------------------------------------------------------


def test_public_name_is_the_config_class() -> None:
    assert TrackerConfig is ConfigFromModule


def test_defaults_match_the_documented_table() -> None:
    config = TrackerConfig()
    assert [f.name for f in dataclasses.fields(config)] == list(DEFAULTS)
    assert dataclasses.asdict(config) == DEFAULTS
    for name, value in DEFAULTS.items():
        got = getattr(config, name)
        assert got == value, name
        assert type(got) is type(value), name


def test_default_configs_are_equal_and_hashable() -> None:
    assert TrackerConfig() == TrackerConfig()
    assert hash(TrackerConfig()) == hash(TrackerConfig())
    assert TrackerConfig() != TrackerConfig(tick_ms=1)


# --- immutability ------------------------------------------------------------------------------


@pytest.mark.parametrize("field", list(DEFAULTS))
def test_frozen(field: str) -> None:
    config = TrackerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, DEFAULTS[field])
    assert getattr(config, field) == DEFAULTS[field]


def test_no_new_attributes() -> None:
    config = TrackerConfig()
    with pytest.raises((AttributeError, TypeError)):
        config.tick = 5  # type: ignore[attr-defined]
    assert not hasattr(config, "tick")


# --- valid edge values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tick_ms", 0),
        ("tick_ms", 2**62 - 1),
        ("strict", True),
        ("min_index_count_per_bucket", 1),
        ("max_time_step_per_segment_ms", 1),
        ("max_indexes_per_segment", 1),
        ("max_indexes_per_segment", -1),
        ("max_num_buckets", 0),
        ("max_num_buckets", -3),
        ("max_num_buckets", 1),
        ("fixed_delay_lookahead", 0),
        ("pause_on_unpersisted", True),
        ("max_unpersisted_indexes", 0),
        ("max_delete_attempts", 1),
        ("delete_retry_delay_ms", 0),
        ("group_commit_max_ops", 1),
        ("group_commit_max_bytes", 1),
        ("group_commit_max_delay_ms", 0),
        ("load_retry_delay_ms", 0),
        ("due_log_memory_keys", 1),
    ],
)
def test_valid_edge_values_are_accepted(field: str, value: object) -> None:
    config = TrackerConfig(**{field: value})  # type: ignore[arg-type]
    assert getattr(config, field) == value
    for other, default in DEFAULTS.items():
        if other != field:
            assert getattr(config, other) == default


# --- invalid values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tick_ms", -1),
        ("tick_ms", -1000),
        ("tick_ms", 2**62),
        ("tick_ms", 2**64),
        ("min_index_count_per_bucket", 0),
        ("min_index_count_per_bucket", -1),
        ("max_time_step_per_segment_ms", 0),
        ("max_time_step_per_segment_ms", -5),
        ("max_indexes_per_segment", 0),
        ("max_indexes_per_segment", -2),
        ("max_indexes_per_segment", -100),
        ("fixed_delay_lookahead", -1),
        ("max_unpersisted_indexes", -1),
        ("max_delete_attempts", 0),
        ("max_delete_attempts", -1),
        ("delete_retry_delay_ms", -1),
        ("group_commit_max_ops", 0),
        ("group_commit_max_bytes", 0),
        ("group_commit_max_delay_ms", -1),
        ("load_retry_delay_ms", -1),
        ("due_log_memory_keys", 0),
    ],
)
def test_invalid_values_raise_value_error_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=_names(field)):
        TrackerConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", [1.0, 5.5, "10", True, False, None, b"1"])
def test_int_fields_reject_wrong_types(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=_names(field)):
        TrackerConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", BOOL_FIELDS)
@pytest.mark.parametrize("value", [0, 1, 1.0, "True", "", None])
def test_bool_fields_reject_wrong_types(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=_names(field)):
        TrackerConfig(**{field: value})  # type: ignore[arg-type]


def test_first_bad_field_is_reported_even_with_others_valid() -> None:
    with pytest.raises(ValueError, match=_names("max_delete_attempts")):
        TrackerConfig(tick_ms=5, strict=True, max_delete_attempts=0)


# --- replace -----------------------------------------------------------------------------------


def test_replace_returns_a_new_config() -> None:
    base = TrackerConfig()
    changed = base.replace(tick_ms=5, strict=True, max_indexes_per_segment=-1)
    assert isinstance(changed, TrackerConfig)
    assert changed is not base
    assert (changed.tick_ms, changed.strict, changed.max_indexes_per_segment) == (5, True, -1)
    assert changed.max_num_buckets == DEFAULTS["max_num_buckets"]
    # The original is untouched.
    assert dataclasses.asdict(base) == DEFAULTS
    assert base.replace() == base


@pytest.mark.parametrize(
    ("changes", "error", "field"),
    [
        ({"tick_ms": -1}, ValueError, "tick_ms"),
        ({"max_indexes_per_segment": 0}, ValueError, "max_indexes_per_segment"),
        ({"fixed_delay_lookahead": -1}, ValueError, "fixed_delay_lookahead"),
        ({"max_delete_attempts": 0}, ValueError, "max_delete_attempts"),
        ({"tick_ms": 1.5}, TypeError, "tick_ms"),
        ({"strict": 1}, TypeError, "strict"),
        ({"max_num_buckets": True}, TypeError, "max_num_buckets"),
    ],
)
def test_replace_validates(changes: dict[str, object], error: type[Exception], field: str) -> None:
    base = TrackerConfig(tick_ms=7)
    with pytest.raises(error, match=_names(field)):
        base.replace(**changes)
    assert base.tick_ms == 7


def test_replace_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError):
        TrackerConfig().replace(no_such_field=1)


@pytest.mark.parametrize(
    "field", [f.name for f in dataclasses.fields(TrackerConfig) if f.type == "int"]
)
def test_huge_int_settings_rejected_at_construction(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TrackerConfig(**cast("dict[str, Any]", {field: 2**63}))  # a field named at run time


# --- the one translation into keyword arguments ---------------------------------------------------


def test_settings_are_the_keyword_arguments_of_what_they_configure() -> None:
    """Every settings dict names parameters its consumer takes, with the config's values."""
    import inspect

    from delayindex import _impl
    from delayindex.snapshot.format import build_snapshot
    from delayindex.storage.catalog import Catalog

    config = TrackerConfig(
        tick_ms=7, strict=True, fixed_delay_lookahead=3, min_index_count_per_bucket=11,
        max_time_step_per_segment_ms=13, max_indexes_per_segment=17, max_delete_attempts=19,
        delete_retry_delay_ms=23,
    )  # fmt: skip
    consumers: list[tuple[Mapping[str, object], Callable[..., object]]] = [
        (config.core_settings(), _impl.PureTrackerCore.__init__),
        (config.bucket_core_settings(), _impl.PureBucketCore.__init__),
        (config.catalog_settings(), Catalog.open),
        (config.builder_settings(), build_snapshot),
    ]
    for settings, consumer in consumers:
        assert set(settings) <= set(inspect.signature(consumer).parameters), consumer
    assert config.bucket_core_settings() == {
        "tick_ms": 7, "strict": True, "fixed_delay_lookahead": 3, "min_index_count_per_bucket": 11,
    }  # fmt: skip
    assert config.catalog_settings() == {"max_delete_attempts": 19, "delete_retry_delay_ms": 23}
    assert config.builder_settings() == {"max_time_step_ms": 13, "max_indexes_per_segment": 17}
    for core in (_impl.TrackerCore(**config.core_settings()),
                 _impl.BucketCore(**config.bucket_core_settings())):  # fmt: skip
        assert (core.tick_ms, core.strict, core.cutoff_for(100)) == (7, True, 100)

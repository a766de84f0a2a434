"""The plan parameters' one type (:class:`shardstream.wire.PlanParams`): what the client
writes is byte for byte what it always wrote, and the server reads a source's mixture by
name, from the positional list every client has sent or from the named form."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import ValidationError

from shardstream.plan import MixtureSchedule, Phase, PlanConfig
from shardstream.server.data.audit_plans import _epoch_size
from shardstream.server.data.epoch_size import epoch_samples
from shardstream.wire import PLAN_CONFIG_FIELDS, PlanParams, SourceMixture, stored_plan_params


def _as_before(
    config: PlanConfig,
    mixture: list[list[Any]],
    schedule: Any = None,
    pack: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The dict the client's BatchStream.plan_params built by hand before PlanParams."""
    params = dataclasses.asdict(config)
    params["mixture"] = mixture
    if schedule is not None:
        params["schedule"] = schedule
    if pack is not None:
        params["pack"] = pack
    return params


def test_the_config_fields_are_the_plan_configs_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(PlanConfig)) == PLAN_CONFIG_FIELDS


SCHEDULE = MixtureSchedule([Phase(until=10, weights=[1, 0]), Phase(weights=[1, 3])])
PACK = {"seq_len": 8, "pad_id": 0, "eos_id": None, "method": "greedy", "rows": 2, "mask": None}


@pytest.mark.parametrize(
    ("config", "mixture", "schedule", "pack"),
    [
        (PlanConfig(global_batch_size=8), [[None, None, None]], None, None),
        (
            PlanConfig(
                seed=7,
                global_batch_size=12,
                num_partitions=4,
                shuffle=False,
                tail="pad",
                window=64,
                epoch_size=100,
            ),
            [[2, None, None], [0.5, 3, None], [None, None, 40]],
            None,
            PACK,
        ),
        (PlanConfig(global_batch_size=4), [[None, None, None]] * 2, SCHEDULE.to_params(), None),
    ],
)
def test_the_client_writes_what_it_always_wrote(
    config: PlanConfig, mixture: list[list[Any]], schedule: Any, pack: dict[str, Any] | None
) -> None:
    """Saved resume states keep matching: same keys, same order, same JSON text."""
    before = _as_before(config, mixture, schedule, pack)
    typed = PlanParams(
        **dataclasses.asdict(config),
        mixture=[SourceMixture(*m) for m in mixture],
        schedule=schedule,
        pack=pack,
    )
    assert json.dumps(typed.to_wire()) == json.dumps(before)
    stored = json.loads(json.dumps(before))  # what the server and a saved state hold
    assert PlanParams.model_validate(stored).to_wire() == stored
    assert PlanParams.model_validate(stored).mixture == [SourceMixture(*m) for m in mixture]


def test_a_mixture_is_read_by_name_from_either_form() -> None:
    params = PlanParams(
        global_batch_size=4,
        mixture=[[0.25, None, None], {"repeat": 2}, {"samples": 9, "weight": None}],
    )
    assert [m.weight for m in params.mixture] == [0.25, None, None]
    assert [m.repeat for m in params.mixture] == [None, 2, None]
    assert [m.samples for m in params.mixture] == [None, None, 9]
    assert params.to_wire()["mixture"] == [[0.25, None, None], [None, 2, None], [None, None, 9]]


@pytest.mark.parametrize("entry", [[1, 2], [1, 2, 3, 4], {"weights": 1}, 5, "abc"])
def test_a_mixture_of_another_shape_is_one_error_naming_it(entry: object) -> None:
    with pytest.raises(ValidationError) as info:
        PlanParams(global_batch_size=4, mixture=[entry])
    assert "mixture" in str(info.value) and "[weight, repeat, samples]" in str(info.value)
    assert repr(entry)[:5] in str(info.value)


def test_unknown_fields_pass_through_in_place() -> None:
    stored = {**_as_before(PlanConfig(global_batch_size=4), [[None, None, None]]), "new": [1]}
    assert list(PlanParams.model_validate(stored).to_wire().items()) == list(stored.items())


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        ([0.5, 2, 10], SourceMixture(0.5, 2, 10)),
        ([None, 2], SourceMixture(None, 2, None)),  # short: by position as far as it goes
        ([1, 2, 3, 4], SourceMixture(1, 2, 3)),
        ([True, 1e308, -1], SourceMixture(None, 1e308, None)),  # bool and negative count
        ({"samples": 5}, SourceMixture(None, None, 5)),
        ({"bogus": 5}, SourceMixture()),
        ("abc", SourceMixture()),
        (None, SourceMixture()),
    ],
)
def test_a_stored_mixture_is_read_leniently(stored: object, read: SourceMixture) -> None:
    """A stored plan may hold anything an old client sent; a page never fails on it."""
    assert SourceMixture.read(stored) == read


def test_stored_plan_params_finds_the_parameters() -> None:
    params = {"global_batch_size": 4}
    assert stored_plan_params({"plan": params, "epoch": 1}) is params
    assert stored_plan_params(params) is params
    assert stored_plan_params({"plan": "junk", "seed": 1}) == {"plan": "junk", "seed": 1}


def test_the_server_reads_a_named_mixture_as_the_positional_one() -> None:
    """Epoch sizes (the console, the mixture figures) and the audit's recomputation."""
    sources = [(None, 100), (None, 50)]
    positional = {"plan": {"global_batch_size": 4, "mixture": [[None, None, 30], [None, 2, None]]}}
    named = {"plan": {"global_batch_size": 4, "mixture": [{"samples": 30}, {"repeat": 2}]}}
    assert epoch_samples(positional, sources) == epoch_samples(named, sources) == 130  # type: ignore[arg-type]
    totals = [100, 50]
    assert _epoch_size(positional["plan"], totals, 4) == _epoch_size(named["plan"], totals, 4)
    assert _epoch_size(named["plan"], totals, 4) == 128


def test_the_audit_names_a_mixture_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"\[weight, repeat, samples\]"):
        _epoch_size({"global_batch_size": 4, "mixture": [[1, 2]]}, [100], 4)

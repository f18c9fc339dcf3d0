"""Tests for openenv_gym.spaces: JSON Schema -> Gymnasium spaces, codecs, descriptions."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import given, settings
from hypothesis import strategies as st
from openenv.core.env_server.types import Action, Observation
from pydantic import BaseModel, Field, TypeAdapter

from openenv_gym.errors import OpenEnvGymError
from openenv_gym.spaces import (
    TEXT_CHARSET,
    FieldCodec,
    JsonText,
    SchemaSpace,
    SpaceMappingError,
    UnicodeText,
    action_space_from_schema,
    describe_space,
    field_space,
    fix_open_shapes,
    observation_space_from_schema,
    space_codec,
    space_from_description,
)

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)

INT64 = np.iinfo(np.int64)

# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


class Pos(BaseModel):
    x: float
    y: float = Field(ge=0.0, le=10.0)


Row3 = Annotated[List[float], Field(min_length=3, max_length=3)]


class MoveAction(Action):
    direction: Literal["up", "down", "left", "right"]
    count: int = Field(ge=0, le=9)
    temperature: float = Field(ge=-1.0, le=1.0)
    label: str
    flags: List[bool] = Field(min_length=3, max_length=3)
    grid: List[Row3] = Field(min_length=2, max_length=2)
    pos: Pos
    note: Optional[str] = Field(default=None, max_length=20)


class RichObservation(Observation):
    temperature: float = Field(ge=-1.0, le=1.0)
    label: str
    flags: List[bool] = Field(min_length=3, max_length=3)
    grid: List[Row3] = Field(min_length=2, max_length=2)
    direction: Literal["up", "down", "left", "right"]
    level: Optional[int] = Field(default=None, ge=1, le=5)
    pos: Optional[Pos] = None


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class ColorObservation(Observation):
    color: Color


Cell = Annotated[int, Field(ge=0, le=2)]
BoardRow = Annotated[List[Cell], Field(min_length=3, max_length=3)]


class BoardObservation(Observation):
    board: List[BoardRow] = Field(min_length=3, max_length=3)


class ScreenObservation(Observation):
    screen: List[float]


class ImageObservation(Observation):
    image: List[List[Annotated[int, Field(ge=0, le=255)]]]
    mask: List[bool]


class FreeObservation(Observation):
    score: float
    info: Dict[str, Any]


class Inner(BaseModel):
    x: float
    tags: Dict[str, int]


class NestedBadObservation(Observation):
    pos: Inner
    hp: int


class Node(BaseModel):
    value: int
    child: Optional["Node"] = None


class TreeObservation(Observation):
    tree: Node


class MessageAction(Action):
    message: str
    verbose: bool = False


class TwoIntAction(Action):
    a: int = Field(ge=0, le=3)
    b: int = Field(ge=-2, le=2)
    extra: Dict[str, Any] = Field(default_factory=dict)


class OpenAction(Action):
    values: List[float]


class UnionAction(Action):
    thing: Union[int, str]
    other: int = Field(ge=0, le=1)


class BoundsObservation(Observation):
    open_int: int
    half_int: int = Field(ge=0)
    strict_int: int = Field(gt=0, lt=10)
    strict_float: float = Field(gt=0.0, lt=1.0)
    tenth: float = Field(ge=-0.1, le=0.1)
    const_tag: Literal["only"]
    codes: Literal[3, 5, 7]


class BoundsAction(Action):
    strict_float: float = Field(gt=0.0, lt=1.0)
    tenth: float = Field(ge=-0.1, le=0.1)


class TruncObservation(Observation):
    value: float
    truncated: bool = False
    debug: str = ""


def rich_payload(**overrides: Any) -> dict[str, Any]:
    obs = RichObservation(
        temperature=0.25,
        label="hello, world!",
        flags=[True, False, True],
        grid=[[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]],
        direction="left",
        level=3,
        pos=Pos(x=-1.5, y=2.0),
    )
    payload = obs.model_dump(exclude={"reward", "done"})
    payload.update(overrides)
    return payload


def text_space(max_length: int = 2**31 - 1) -> UnicodeText:
    return UnicodeText(max_length)


def f32_box(low: float, high: float, shape: tuple[int, ...] = ()) -> gs.Box:
    return gs.Box(low, high, shape=shape, dtype=np.float32)


# ---------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------


def f64_box(low: float, high: float, shape: tuple[int, ...] = ()) -> gs.Box:
    return gs.Box(low, high, shape=shape, dtype=np.float64)


def test_action_space_is_exact() -> None:
    # Numbers of actions are float64 (those of observations float32): JSON carries them so.
    ss = action_space_from_schema(MoveAction.model_json_schema())
    expected = gs.Dict(
        {
            "count": gs.Discrete(10),
            "direction": gs.Discrete(4),
            "flags": gs.MultiBinary(3),
            "grid": f64_box(-np.inf, np.inf, (2, 3)),
            "label": text_space(),
            "note": text_space(20),
            "pos": gs.Dict({"x": f64_box(-np.inf, np.inf), "y": f64_box(0.0, 10.0)}),
            "temperature": f64_box(-1.0, 1.0),
        }
    )
    assert ss.space == expected
    assert list(ss.space.spaces) == sorted(expected.spaces)
    assert ss.fields == ("count", "direction", "flags", "grid", "label", "note", "pos", "temperature")
    assert ss.single_field is None
    assert "metadata" not in ss.fields
    assert ss.space["grid"].dtype == np.float64
    assert ss.space["label"].character_list == tuple(TEXT_CHARSET)


def test_action_samples_are_accepted_by_the_model() -> None:
    ss = action_space_from_schema(MoveAction.model_json_schema())
    ss.space.seed(0)
    for _ in range(40):
        wire = ss.to_wire(ss.space.sample())
        json.dumps(wire, allow_nan=False)
        model = MoveAction.model_validate(wire)
        assert model.direction in ("up", "down", "left", "right")
        assert isinstance(wire["flags"][0], bool)
        assert isinstance(wire["count"], int) and 0 <= wire["count"] <= 9
        assert isinstance(wire["temperature"], float)
        assert len(wire["grid"]) == 2 and all(len(r) == 3 for r in wire["grid"])


def test_action_to_wire_values() -> None:
    ss = action_space_from_schema(MoveAction.model_json_schema())
    value = {
        "count": np.int64(7),
        "direction": np.int64(2),
        "flags": np.array([1, 0, 1], dtype=np.int8),
        "grid": np.arange(6, dtype=np.float32).reshape(2, 3),
        "label": "a b",
        "note": "",
        "pos": {"x": np.float32(1.5), "y": np.array(2.0, dtype=np.float32)},
        "temperature": np.array(-0.5, dtype=np.float32),
    }
    wire = ss.to_wire(value)
    assert wire == {
        "count": 7,
        "direction": "left",
        "flags": [True, False, True],
        "grid": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
        "label": "a b",
        "pos": {"x": 1.5, "y": 2.0},
        "temperature": -0.5,
    }  # note "": empty, where its default is null: not sent
    assert type(wire["temperature"]) is float and type(wire["count"]) is int
    assert ss.to_wire({**value, "note": "n"})["note"] == "n"
    with pytest.raises(SpaceMappingError, match="'direction'"):
        ss.to_wire({**value, "direction": 4})
    with pytest.raises(SpaceMappingError, match="'pos.y'"):
        ss.to_wire({**value, "pos": {"x": 1.0}})


def test_optional_action_fields_are_in_the_space_and_sent_only_when_they_say_something() -> None:
    ss = action_space_from_schema(MessageAction.model_json_schema())
    assert ss.single_field is None and ss.fields == ("message", "verbose")
    assert ss.space == gs.Dict({"message": text_space(), "verbose": gs.Discrete(2)})
    assert ss.to_wire({"message": "hi", "verbose": np.int64(0)}) == {"message": "hi"}  # verbose: its default
    wire = ss.to_wire({"message": "hi", "verbose": np.int64(1)})
    assert wire == {"message": "hi", "verbose": True} and MessageAction.model_validate(wire).verbose
    alone = action_space_from_schema(MessageAction.model_json_schema(), action_key="message")
    assert alone.single_field == "message" and alone.space == text_space()


def test_action_key_selects_a_field() -> None:
    ss = action_space_from_schema(MessageAction.model_json_schema(), action_key="verbose")
    assert ss.space == gs.Discrete(2) and ss.single_field == "verbose"
    assert ss.to_wire(np.int64(1)) == {"verbose": True}
    assert MessageAction.model_validate({"message": "m", **ss.to_wire(0)}).verbose is False
    with pytest.raises(SpaceMappingError, match="action_key="):
        action_space_from_schema(MessageAction.model_json_schema(), action_key="nope")


def test_an_optional_free_form_action_field_is_json_text_left_out_at_its_default() -> None:
    ss = action_space_from_schema(TwoIntAction.model_json_schema())
    assert ss.space == gs.Dict({"a": gs.Discrete(4), "b": gs.Discrete(5, start=-2), "extra": JsonText()})
    assert ss.fields == ("a", "b", "extra")
    ss.space.seed(2)
    for _ in range(10):
        wire = ss.to_wire(ss.space.sample())
        assert set(wire) == {"a", "b"}  # extra: "{}", its default, is not sent
        TwoIntAction.model_validate(wire)
    assert ss.to_wire({"a": 1, "b": 0, "extra": '{"k": [1]}'})["extra"] == {"k": [1]}


def test_an_optional_tag_is_left_to_the_server_and_defaults_are_not_sent() -> None:
    class ToolCall(Action):
        type: Literal["call_tool"] = "call_tool"
        tool_name: str
        arguments: Dict[str, Any] = Field(default_factory=dict)
        note: Optional[str] = None
        level: int = 3

    ss = action_space_from_schema(ToolCall.model_json_schema())
    assert ss.fields == ("arguments", "level", "note", "tool_name")  # not the type tag
    wire = ss.to_wire({"tool_name": "add", "arguments": '{"a": 1}', "note": "", "level": np.int64(3)})
    assert wire == {"tool_name": "add", "arguments": {"a": 1}}  # note "": nothing; level 3: its default
    assert ToolCall.model_validate(wire).arguments == {"a": 1}
    assert ss.to_wire({"tool_name": "add", "arguments": "{}", "note": "n", "level": np.int64(0)})["level"] == 0

    class Game(Action):
        move: int = Field(ge=0, le=8)
        game: str = "tic_tac_toe"

    game = action_space_from_schema(Game.model_json_schema())
    assert game.to_wire({"move": np.int64(4), "game": "tic_tac_toe"}) == {"move": 4}  # its default: not sent
    assert game.to_wire({"move": np.int64(4), "game": ""}) == {"move": 4, "game": ""}  # "" is what was asked for
    assert action_space_from_schema(Game.model_json_schema(), action_key="move").to_wire(np.int64(4)) == {"move": 4}

    class Big(Action):
        payload: Dict[str, Any]

    big = action_space_from_schema(Big.model_json_schema())
    with pytest.raises(SpaceMappingError, match="outside"):  # no wire format carries these
        big.to_wire('{"n": 18446744073709551616}')
    with pytest.raises(SpaceMappingError, match="surrogate"):
        big.to_wire('{"text": "\\ud800"}')
    with pytest.raises(SpaceMappingError, match="deeper than 24"):
        big.to_wire('{"a": ' * 25 + "1" + "}" * 25)
    assert big.to_wire('{"a": ' * 23 + "1" + "}" * 23)["payload"]["a"]  # 24 levels: fine

    no_items = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}}, "required": ["a"]}
    assert action_space_from_schema(no_items).fields == ("a",)  # an optional array without items: left out


def test_an_open_length_action_array_is_a_sequence_of_numbers() -> None:
    # (an action has no first observation to take a shape from: tokens, a portfolio's weights)
    ss = action_space_from_schema(OpenAction.model_json_schema())
    item = ss.space.feature_space if ss.single_field else ss.space["values"].feature_space
    assert isinstance(item, gs.Box) and item.shape == ()
    value = (np.float32(0.5), np.float32(-1.0), np.float32(2.0))
    wire = ss.to_wire(value if ss.single_field else {"values": value})
    assert wire["values"] == [0.5, -1.0, 2.0] and OpenAction.model_validate(wire).values == [0.5, -1.0, 2.0]


def test_an_action_union_field_is_json_text() -> None:
    ss = action_space_from_schema(UnionAction.model_json_schema())
    assert ss.space["thing"] == JsonText()
    assert ss.to_wire({"thing": "5", "other": 1}) == {"thing": 5, "other": 1}
    assert ss.to_wire({"thing": '"five"', "other": 0}) == {"thing": "five", "other": 0}
    # Selecting the other field alone.
    ss = action_space_from_schema(UnionAction.model_json_schema(), action_key="other")
    assert ss.space == gs.Discrete(2)


def test_spacemappingerror_is_valueerror_and_library_error() -> None:
    assert issubclass(SpaceMappingError, ValueError)
    assert issubclass(SpaceMappingError, OpenEnvGymError)


# ---------------------------------------------------------------------------
# Observations
# ---------------------------------------------------------------------------


def test_observation_space_is_exact() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    expected = gs.Dict(
        {
            "direction": gs.Discrete(4),
            "flags": gs.MultiBinary(3),
            "grid": f32_box(-np.inf, np.inf, (2, 3)),
            "label": text_space(),
            "level": gs.Discrete(5, start=1),
            "pos": gs.Dict({"x": f32_box(-np.inf, np.inf), "y": f32_box(0.0, 10.0)}),
            "temperature": f32_box(-1.0, 1.0),
        }
    )
    assert ss.space == expected
    assert ss.fields == tuple(sorted(expected.spaces))
    assert ss.single_field is None
    assert not {"done", "reward", "metadata"} & set(ss.fields)
    assert not ss.is_open


def test_observation_from_wire_values() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    value = ss.from_wire(rich_payload())
    assert ss.space.contains(value)
    assert value["direction"] == 2 and type(value["direction"]) is np.int64
    assert value["level"] == 3 and type(value["level"]) is np.int64
    np.testing.assert_array_equal(value["flags"], [1, 0, 1])
    assert value["flags"].dtype == np.int8
    np.testing.assert_array_equal(value["grid"], [[1, 2, 3], [4, 5, 6.5]])
    assert value["grid"].dtype == np.float32 and value["grid"].shape == (2, 3)
    assert value["temperature"].shape == () and value["temperature"].dtype == np.float32
    assert value["label"] == "hello, world!"
    assert float(value["pos"]["x"]) == -1.5


def test_from_wire_returns_new_objects() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    grid = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    flags = np.array([1, 0, 1], dtype=np.int8)
    payload = rich_payload(grid=grid, flags=flags)
    a = ss.from_wire(payload)
    b = ss.from_wire(payload)
    for key in ("grid", "flags", "temperature"):
        assert not np.shares_memory(a[key], b[key])
    assert not np.shares_memory(a["grid"], grid)
    assert not np.shares_memory(a["flags"], flags)
    assert a is not b and a["pos"] is not b["pos"]
    a["grid"][0, 0] = 99.0
    assert grid[0, 0] == 1.0 and b["grid"][0, 0] == 1.0


def test_observation_samples_are_valid_observations() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    ss.space.seed(3)
    for _ in range(30):
        sample = ss.space.sample()
        wire = ss.to_wire(sample)
        obs = RichObservation.model_validate(wire)
        # and back: the decoded wire value equals the sample
        again = ss.from_wire(obs.model_dump())
        np.testing.assert_array_equal(again["grid"], sample["grid"])
        assert again["direction"] == sample["direction"]
        assert again["label"] == sample["label"]


def test_single_field_observation_is_the_field_space() -> None:
    ss = observation_space_from_schema(BoardObservation.model_json_schema())
    assert ss.single_field == "board" and ss.fields == ("board",)
    assert ss.space == gs.Box(0, 2, shape=(3, 3), dtype=np.int64)
    assert ss.space.dtype == np.int64
    board = [[0, 1, 2], [2, 1, 0], [1, 1, 1]]
    value = ss.from_wire({"board": board, "done": False, "reward": None, "metadata": {}})
    assert isinstance(value, np.ndarray) and value.shape == (3, 3) and value.dtype == np.int64
    np.testing.assert_array_equal(value, board)
    ss.space.seed(4)
    BoardObservation.model_validate(ss.to_wire(ss.space.sample()))


def test_obs_key_selects_one_field() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema(), obs_key="grid")
    assert ss.single_field == "grid" and ss.space == f32_box(-np.inf, np.inf, (2, 3))
    assert ss.from_wire(rich_payload()).shape == (2, 3)
    with pytest.raises(SpaceMappingError, match="obs_key="):
        observation_space_from_schema(RichObservation.model_json_schema(), obs_key="missing")


def test_truncated_key_and_exclude() -> None:
    schema = TruncObservation.model_json_schema()
    ss = observation_space_from_schema(schema)
    assert ss.fields == ("debug", "truncated", "value")
    ss = observation_space_from_schema(schema, truncated_key="truncated", exclude=["debug"])
    assert ss.single_field == "value" and ss.space == f32_box(-np.inf, np.inf)
    sub = observation_space_from_schema(RichObservation.model_json_schema(), exclude=["pos.x", "label"])
    assert "label" not in sub.fields and list(sub.space["pos"].spaces) == ["y"]


def test_enum_class_round_trip() -> None:
    schema = ColorObservation.model_json_schema()
    assert "$defs" in schema  # Enum classes are referenced
    ss = observation_space_from_schema(schema)
    assert ss.space == gs.Discrete(3) and ss.single_field == "color"
    for i, name in enumerate(["red", "green", "blue"]):
        assert ss.from_wire({"color": name}) == i
        assert ss.to_wire(np.int64(i)) == {"color": name}
        assert ColorObservation.model_validate(ss.to_wire(i)).color.value == name
    with pytest.raises(SpaceMappingError) as info:
        ss.from_wire({"color": "purple"})
    assert "'color'" in str(info.value) and "purple" in str(info.value)


def test_numeric_bounds_and_literals() -> None:
    ss = observation_space_from_schema(BoundsObservation.model_json_schema())
    sp = ss.space
    assert sp["open_int"] == gs.Box(-np.inf, np.inf, shape=(), dtype=np.int64)
    assert sp["open_int"].low == INT64.min and sp["open_int"].high == INT64.max
    assert not sp["open_int"].bounded_below and not sp["open_int"].bounded_above
    assert sp["half_int"].low == 0 and sp["half_int"].high == INT64.max
    assert sp["half_int"].bounded_below and not sp["half_int"].bounded_above
    assert sp["strict_int"] == gs.Discrete(9, start=1)
    # Observations: float32 bounds rounded outwards, so that what the server sends is in the space.
    assert float(sp["strict_float"].low) == 0.0 and float(sp["strict_float"].high) == 1.0
    assert float(sp["tenth"].high) >= 0.1 and float(sp["tenth"].low) <= -0.1
    for edge in (0.1, -0.1):
        assert sp.contains(ss.from_wire({**_bounds_payload(), "tenth": edge}))
    assert sp["const_tag"] == gs.Discrete(1)
    assert sp["codes"] == gs.Discrete(3)
    assert ss.to_wire({**ss.space.sample(), "codes": 2})["codes"] == 7
    assert ss.from_wire({**_bounds_payload(), "codes": 5})["codes"] == 1
    # Actions: rounded inwards, so that every sample satisfies the schema.
    acts = action_space_from_schema(BoundsAction.model_json_schema())
    low, high = float(acts.space["strict_float"].low), float(acts.space["strict_float"].high)
    assert 0.0 < low < 1e-40 and 0.999 < high < 1.0
    assert float(acts.space["tenth"].high) <= 0.1 and float(acts.space["tenth"].low) >= -0.1
    acts.space.seed(5)
    for _ in range(30):
        BoundsAction.model_validate(acts.to_wire(acts.space.sample()))


def test_an_optional_string_with_a_min_length_that_is_null_is_in_the_observation_space() -> None:
    class Named(Observation):
        tag: Optional[str] = Field(None, min_length=3)

    ss = observation_space_from_schema(Named.model_json_schema())
    assert ss.space.contains(ss.from_wire(Named().model_dump()))


def _bounds_payload() -> dict[str, Any]:
    return BoundsObservation(
        open_int=-5,
        half_int=3,
        strict_int=4,
        strict_float=0.5,
        tenth=0.0,
        const_tag="only",
        codes=3,
    ).model_dump()


def test_action_number_bounds_are_the_schemas_own() -> None:
    # As float32 (before), le=0.3 became 0.29999998: an action of 0.3, which the server takes, was
    # refused; and 0.7 reached the env as 0.699999988. As float64 both are exact.
    schema = {"type": "number", "minimum": 0.3, "maximum": 0.7}
    space, codec = field_space(schema, {}, "v", "action")
    assert space.dtype == np.float64 and (float(space.low), float(space.high)) == (0.3, 0.7)
    assert space.contains(np.array(0.3)) and space.contains(np.array(0.7))
    assert codec.to_wire(np.float64(0.7)) == 0.7 and codec.to_wire(space.low) == 0.3
    # Exclusive bounds: the next float64 inwards; every sample satisfies the schema.
    space, codec = field_space({"type": "number", "exclusiveMinimum": 0.3, "exclusiveMaximum": 0.7}, {}, "v", "action")
    assert 0.3 < float(space.low) < 0.3 + 1e-15 and 0.7 - 1e-15 < float(space.high) < 0.7
    space.seed(0)
    assert all(0.3 < codec.to_wire(space.sample()) < 0.7 for _ in range(200))
    with pytest.raises(SpaceMappingError, match="action field 'v'"):  # no float64 in (0.1, 0.1]
        field_space({"type": "number", "exclusiveMinimum": 0.1, "maximum": 0.1}, {}, "v", "action")
    # Observations stay float32, rounded outwards: what the server sends, read as float32, is in.
    space, _ = field_space(schema, {}, "v", "observation")
    assert space.dtype == np.float32 and space.contains(np.array(0.7, np.float32)) and space.contains(np.array(0.3, np.float32))


def test_boolean_field_codec() -> None:
    space, codec = field_space({"type": "boolean"}, {}, "ok", "action")
    assert space == gs.Discrete(2) and codec.kind == "bool"
    assert codec.to_wire(np.int64(1)) is True and codec.to_wire(0) is False
    assert codec.from_wire(True) == 1 and type(codec.from_wire(True)) is np.int64
    with pytest.raises(SpaceMappingError, match="'ok'"):
        codec.from_wire("yes")


def test_nullable_and_default_fields() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    value = ss.from_wire(rich_payload(level=None, pos=None))
    assert ss.space.contains(value)
    assert value["level"] == 1  # lowest value of Discrete(5, start=1)
    assert float(value["pos"]["x"]) == 0.0 and float(value["pos"]["y"]) == 0.0
    payload = rich_payload()
    del payload["level"]
    assert ss.from_wire(payload)["level"] == 1
    del payload["label"]  # required, no default: read as a null is (a server's bare reset observation)
    assert ss.from_wire(payload)["label"] == ""


def test_from_wire_shape_mismatch() -> None:
    ss = observation_space_from_schema(RichObservation.model_json_schema())
    with pytest.raises(SpaceMappingError) as info:
        ss.from_wire(rich_payload(grid=[[1.0, 2.0], [3.0, 4.0]]))
    assert "'grid'" in str(info.value) and "(2, 3)" in str(info.value)
    with pytest.raises(SpaceMappingError, match="'grid'"):
        ss.from_wire(rich_payload(grid=[[1.0, 2.0, 3.0], [4.0]]))
    with pytest.raises(SpaceMappingError, match="'label'"):
        ss.from_wire(rich_payload(label=5))
    # schema-derived arrays need the exact nesting, not just the element count
    with pytest.raises(SpaceMappingError, match="'grid'"):
        ss.from_wire(rich_payload(grid=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))


def test_free_form_observation_fields_go_to_info_and_nested_ones_name_field_and_fix() -> None:
    # A top-level Dict[str, Any] is no space: it travels in info, under its name.
    ss = observation_space_from_schema(FreeObservation.model_json_schema())
    assert ss.single_field == "score" and ss.info_fields == ("info",)
    assert ss.info_of({"score": 1.0, "info": {"a": [1]}}) == {"info": {"a": [1]}}
    ok = observation_space_from_schema(FreeObservation.model_json_schema(), exclude=["info"])
    assert ok.single_field == "score" and ok.info_fields == ()

    class OnlyFree(Observation):
        info: Dict[str, Any]

    only = observation_space_from_schema(OnlyFree.model_json_schema())  # nothing else: the field's JSON text
    assert only.single_field == "info" and only.space == JsonText() and only.info_fields == ()
    assert only.from_wire({"info": {"a": 1}}) == '{"a":1}'

    with pytest.raises(SpaceMappingError) as info:  # a nested model field that cannot be mapped
        observation_space_from_schema(TreeObservation.model_json_schema())
    msg = str(info.value)
    assert "observation field" in msg and "observation_space=" in msg and "obs_key=" in msg

    nested = observation_space_from_schema(NestedBadObservation.model_json_schema())
    assert nested.space["pos"]["tags"] == JsonText()  # free-form inside a field: its JSON text
    assert nested.from_wire({"hp": 1, "pos": {"x": 0.5, "tags": {"a": 1}}})["pos"]["tags"] == '{"a":1}'
    ok = observation_space_from_schema(NestedBadObservation.model_json_schema(), exclude=["pos.tags"])
    assert ok.space == gs.Dict(
        {
            "hp": gs.Box(-np.inf, np.inf, (), np.int64),
            "pos": gs.Dict({"x": f32_box(-np.inf, np.inf)}),
        }
    )


def test_recursive_schema_is_an_error() -> None:
    with pytest.raises(SpaceMappingError) as info:
        observation_space_from_schema(TreeObservation.model_json_schema())
    assert "recursive" in str(info.value) and "tree.child" in str(info.value)


def test_hand_written_schema_features() -> None:
    root = {
        "$defs": {
            "P": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 2}},
            }
        },
        "type": "object",
        "properties": {
            "p": {"allOf": [{"$ref": "#/$defs/P"}], "default": {"a": 1}},
            "n": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "t": {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 2, "maxLength": 5}]},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "number"}, {"type": "number"}],
                "minItems": 2,
                "maxItems": 2,
            },
            "cube": _fixed(_fixed(_fixed({"type": "boolean"}))),
        },
    }
    ss = observation_space_from_schema(root)
    assert ss.space["p"] == gs.Dict({"a": gs.Discrete(3)})
    assert ss.space["n"].low == 0 and ss.space["n"].high == np.inf  # observations: bounds outwards
    assert ss.space["t"] == UnicodeText(5)  # null reads as ""
    assert ss.space["pair"] == f32_box(-np.inf, np.inf, (2,))
    assert ss.space["cube"] == gs.MultiBinary([2, 2, 2])
    value = ss.from_wire({"n": 1.0, "t": None, "pair": [1, 2], "cube": [[[True, False]] * 2] * 2})
    assert value["p"] == {"a": 1}  # the schema default fills the missing field
    assert value["t"] == "" and value["cube"].shape == (2, 2, 2)
    assert ss.space.contains(value)


def _fixed(items: dict[str, Any], n: int = 2) -> dict[str, Any]:
    return {"type": "array", "minItems": n, "maxItems": n, "items": items}


def test_enum_values_compare_as_json() -> None:
    space, codec = field_space({"enum": [0, 1, "1", None]}, {}, "e", "observation")
    assert space == gs.Discrete(4)
    assert codec.from_wire(1) == 1 and codec.from_wire(1.0) == 1
    assert codec.from_wire("1") == 2 and codec.from_wire(None) == 3
    with pytest.raises(SpaceMappingError, match="'e'"):
        codec.from_wire(True)  # a boolean is not the number 1
    assert codec.to_wire(3) is None and codec.to_wire(2) == "1"


def test_partly_open_shape_checks_known_dims() -> None:
    schema = {"properties": {"rows": _fixed({"type": "array", "items": {"type": "number"}})}}
    ss = observation_space_from_schema(schema)
    assert ss.is_open and ss.single_field == "rows"
    fixed = fix_open_shapes(ss, {"rows": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]})
    assert fixed.space == f32_box(-np.inf, np.inf, (2, 3))
    with pytest.raises(SpaceMappingError, match="'rows'"):
        fix_open_shapes(ss, {"rows": [[1.0], [2.0], [3.0]]})


def test_bad_schemas() -> None:
    with pytest.raises(SpaceMappingError, match="'x'"):
        observation_space_from_schema({"properties": {"x": {"$ref": "#/$defs/Nope"}}})
    with pytest.raises(SpaceMappingError, match="'x'.*empty"):
        observation_space_from_schema({"properties": {"x": {"type": "integer", "minimum": 5, "maximum": 1}}})
    with pytest.raises(SpaceMappingError, match="'x'"):
        observation_space_from_schema({"properties": {"x": {"$ref": "http://evil/schema"}}})
    with pytest.raises(SpaceMappingError, match="observation schema"):
        observation_space_from_schema({"type": "object"})
    # Malformed where a peer's schema may be: each a SpaceMappingError naming the field, never a TypeError.
    with pytest.raises(SpaceMappingError, match="'x'.*'properties' must be a map"):
        observation_space_from_schema({"properties": {"x": {"type": "object", "properties": None}}})
    with pytest.raises(SpaceMappingError, match="'x'.*'properties' must be a map"):
        action_space_from_schema({"properties": {"x": {"type": "object", "items": {}}}})
    with pytest.raises(SpaceMappingError, match=r"'x'.*\$ref must be a string"):
        observation_space_from_schema({"properties": {"x": {"$ref": ["#/$defs/A"]}}})
    ss = observation_space_from_schema(
        {"properties": {"x": {"type": "integer"}}, "required": [["x"], 3, "x"]}  # (only names count)
    )
    assert ss.fields == ("x",)


# ---------------------------------------------------------------------------
# Open shapes
# ---------------------------------------------------------------------------


def test_fix_open_shapes_single_field() -> None:
    ss = observation_space_from_schema(ScreenObservation.model_json_schema())
    assert ss.is_open and ss.open_fields == ("screen",)
    with pytest.raises(SpaceMappingError) as info:
        ss.from_wire({"screen": [1.0, 2.0]})
    assert "'screen'" in str(info.value) and "observation_space=" in str(info.value)
    fixed = fix_open_shapes(ss, {"screen": [0.5] * 5, "done": False})
    assert not fixed.is_open
    assert fixed.space == f32_box(-np.inf, np.inf, (5,))
    np.testing.assert_array_equal(fixed.from_wire({"screen": [1, 2, 3, 4, 5]}), [1, 2, 3, 4, 5])
    with pytest.raises(SpaceMappingError, match="'screen'"):
        fixed.from_wire({"screen": [1.0] * 6})
    assert fix_open_shapes(fixed, {"screen": [1.0]}) is fixed


def test_fix_open_shapes_nested_and_dict() -> None:
    ss = observation_space_from_schema(ImageObservation.model_json_schema())
    assert ss.open_fields == ("image", "mask")
    payload = {"image": [[0, 255, 3], [4, 5, 6]], "mask": [True, False, False, True]}
    fixed = fix_open_shapes(ss, payload)
    assert fixed.space == gs.Dict({"image": gs.Box(0, 255, (2, 3), np.int64), "mask": gs.MultiBinary(4)})
    value = fixed.from_wire(payload)
    assert fixed.space.contains(value)
    ImageObservation.model_validate(fixed.to_wire(value))
    no_mask = fix_open_shapes(ss, {"image": [[1]]})  # no value to take a shape from: info
    assert no_mask.info_fields == ("mask",) and list(no_mask.space.spaces) == ["image"]
    with pytest.raises(SpaceMappingError, match="'image'"):
        fix_open_shapes(ss, {"image": [[1, 2], [3]], "mask": [True]})


# ---------------------------------------------------------------------------
# Explicit spaces
# ---------------------------------------------------------------------------


def test_space_codec_box_single_field_reshapes_and_copies() -> None:
    schema = ScreenObservation.model_json_schema()
    ss = space_codec(gs.Box(0.0, 1.0, (2, 2), np.float32), schema=schema)
    assert ss.single_field == "screen"
    data = np.array([0.1, 0.2, 0.3, 0.4])
    value = ss.from_wire({"screen": data})
    assert value.shape == (2, 2) and value.dtype == np.float32
    assert not np.shares_memory(value, data)
    assert ss.to_wire(value) == {"screen": value.tolist()}


def test_space_codec_uses_schema_codec_for_equal_spaces() -> None:
    schema = MoveAction.model_json_schema()
    ss = space_codec(gs.Discrete(4), role="action", schema=schema, key="direction")
    assert ss.to_wire(np.int64(3)) == {"direction": "right"}
    ss = space_codec(gs.Discrete(10), role="action", schema=schema, key="count")
    assert ss.to_wire(np.int64(3)) == {"count": 3}


def test_space_codec_dict_and_ambiguity() -> None:
    schema = MoveAction.model_json_schema()
    space = gs.Dict({"direction": gs.Discrete(4), "count": gs.Discrete(10)})
    ss = space_codec(space, role="action", schema=schema)
    assert ss.fields == ("count", "direction") and ss.single_field is None
    assert ss.to_wire({"direction": 0, "count": 4}) == {"count": 4, "direction": "up"}
    with pytest.raises(SpaceMappingError, match="action_key="):
        space_codec(gs.Discrete(4), role="action", schema=schema)
    with pytest.raises(SpaceMappingError, match="obs_key="):
        space_codec(gs.Box(0, 1, (3,)), schema=RichObservation.model_json_schema())
    with pytest.raises(SpaceMappingError, match="obs_key="):
        space_codec(gs.Box(0, 1, (3,)))


def test_space_codec_other_space_types() -> None:
    space = gs.Dict(
        {
            "t": gs.Tuple([gs.Discrete(3), gs.Text(10)]),
            "md": gs.MultiDiscrete([3, 4], start=[1, 0]),
            "mb": gs.MultiBinary(2),
        }
    )
    ss = space_codec(space)
    value = ss.from_wire({"t": [2, "abc"], "md": [3, 0], "mb": [1, 0]})
    assert value["t"] == (2, "abc") and type(value["t"][0]) is np.int64
    assert value["md"].dtype == np.int64 and value["mb"].dtype == np.int8
    assert space.contains(value)
    assert ss.to_wire(value) == {"t": [2, "abc"], "md": [3, 0], "mb": [1, 0]}
    with pytest.raises(SpaceMappingError, match="'md'"):
        ss.from_wire({"t": [2, "abc"], "md": [3, 0, 1], "mb": [1, 0]})


def test_space_codec_dict_for_single_object_field() -> None:
    schema = TreeObservation.model_json_schema()
    space = gs.Dict({"value": gs.Discrete(100)})
    ss = space_codec(space, schema=schema)
    assert ss.single_field == "tree"
    assert ss.from_wire({"tree": {"value": 42, "child": None}}) == {"value": 42}


# ---------------------------------------------------------------------------
# Descriptions
# ---------------------------------------------------------------------------

ROUND_TRIP_SPACES = [
    gs.Box(-1.0, 1.0, (3,), np.float32),
    gs.Box(-np.inf, np.inf, (2, 2), np.float64),
    gs.Box(np.float32([0.0, -np.inf]), np.float32([np.inf, 1.5]), dtype=np.float32),
    gs.Box(0, 255, (84, 84, 4), np.uint8),
    gs.Box(-np.inf, 7, (2,), np.int64),
    gs.Box(np.array([INT64.min + 1, -3]), np.array([INT64.max - 1, 9]), dtype=np.int64),
    gs.Box(0, 1, (), np.float16),
    gs.Box(0, 1, (2,), np.bool_),
    gs.Box(0, 2**64 - 1, (1,), np.uint64),
    gs.Box(0.0, 1.0, (0, 3), np.float32),
    gs.Discrete(5),
    gs.Discrete(3, start=-1, dtype=np.int32),
    gs.MultiDiscrete([3, 4, 5]),
    gs.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, -1], [0, 7]]), dtype=np.int16),
    gs.MultiBinary(4),
    gs.MultiBinary([2, 3]),
    gs.Text(12),
    gs.Text(30, min_length=2, charset="zyx ,!é"),
    UnicodeText(40, min_length=1),
    gs.Dict([("zeta", gs.Discrete(2)), ("alpha", gs.Box(0, 1, (2,))), ("mid", gs.Text(3))]),
    gs.Tuple([gs.Discrete(2), gs.Tuple([gs.MultiBinary(1)]), gs.Dict({"a": gs.Discrete(3)})]),
]


def _assert_exact(a: gym.Space, b: gym.Space) -> None:
    assert type(a) is type(b) and a == b
    if isinstance(a, gs.Box):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high)
        assert np.array_equal(a.bounded_below, b.bounded_below)
        assert np.array_equal(a.bounded_above, b.bounded_above)
    elif isinstance(a, gs.Text):
        assert a.character_list == b.character_list
    elif isinstance(a, gs.Dict):
        assert list(a.spaces) == list(b.spaces)
        for k in a.spaces:
            _assert_exact(a[k], b[k])
    elif isinstance(a, gs.Tuple):
        for x, y in zip(a.spaces, b.spaces):
            _assert_exact(x, y)
    elif isinstance(a, (gs.Discrete, gs.MultiDiscrete)):
        assert a.dtype == b.dtype and np.array_equal(a.start, b.start)


@pytest.mark.parametrize("space", ROUND_TRIP_SPACES, ids=lambda s: type(s).__name__)
def test_describe_round_trip(space: gym.Space) -> None:
    desc = describe_space(space)
    text = json.dumps(desc, allow_nan=False)  # strict JSON: no bare inf/nan
    again = space_from_description(json.loads(text))
    _assert_exact(space, again)
    assert describe_space(again) == desc


def test_describe_formats() -> None:
    d = describe_space(gs.Box(np.float32([0.0, -np.inf]), np.float32([np.inf, 1.5])))
    assert d == {
        "type": "Box",
        "dtype": "float32",
        "shape": [2],
        "low": [0.0, "-inf"],
        "high": ["inf", 1.5],
    }
    d = describe_space(gs.Dict([("b", gs.Discrete(2)), ("a", gs.Discrete(3, start=1))]))
    assert d["keys"] == ["b", "a"]
    assert d["spaces"][1] == {"type": "Discrete", "n": 3, "start": 1, "dtype": "int64"}
    assert describe_space(gs.MultiBinary([2, 3])) == {"type": "MultiBinary", "n": [2, 3]}
    assert describe_space(gs.Text(4, min_length=1, charset="ab")) == {"type": "Text", "min_length": 1, "max_length": 4, "charset": "ab"}
    assert describe_space(gs.Sequence(gs.Discrete(2), stack=True)) == {
        "type": "Sequence",
        "feature_space": {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"},
        "stack": True,
    }
    with pytest.raises(SpaceMappingError):
        describe_space(gs.Graph(gs.Discrete(2), None))


def _deep(n: int) -> dict[str, Any]:
    desc: dict[str, Any] = {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"}
    for _ in range(n):
        desc = {"type": "Tuple", "spaces": [desc]}
    return desc


def _box(**kw: Any) -> dict[str, Any]:
    base = {"type": "Box", "dtype": "float32", "shape": [2], "low": [0.0, 0.0], "high": [1.0, 1.0]}
    return {**base, **kw}


def _ibox(dtype: str, low: Any, high: Any) -> dict[str, Any]:
    return {"type": "Box", "dtype": dtype, "shape": [1], "low": [low], "high": [high]}


def _md(nvec: Any, start: Any) -> dict[str, Any]:
    return {"type": "MultiDiscrete", "nvec": nvec, "start": start, "dtype": "int64"}


HOSTILE = {
    "not a dict": ["Box"],
    "unknown type": {"type": "Graph"},
    "type not str": {"type": ["Box"]},
    "extra key": _box(evil="__import__('os')"),
    "missing key": {"type": "Discrete", "n": 3, "dtype": "int64"},
    "object dtype": _box(dtype="object"),
    "eval dtype": _box(dtype="__import__('os').system('true')"),
    "numpy alias dtype": _box(dtype="<f4"),
    "float128": _box(dtype="float128"),
    "negative shape": _box(shape=[-2], low=[], high=[]),
    "bool in shape": _box(shape=[True, 2]),
    "shape too large": _box(shape=[2**16, 2**16], low=[], high=[]),
    "shape too deep": _box(shape=[1] * 33, low=[], high=[]),
    "bounds shape mismatch": _box(low=[0.0], high=[1.0, 1.0]),
    "bounds not numbers": _box(low=["x", 0.0]),
    "nan bound": _box(low=["nan", 0.0]),
    "low above high": _box(low=[2.0, 0.0]),
    "float beyond float16": _box(dtype="float16", high=[1e10, 1.0]),
    "inf in uint box": _ibox("uint8", 0, "inf"),
    "wrong-sign inf in int box": _ibox("int64", "inf", 5),
    "nan in int box": _ibox("int64", "nan", 5),
    "float in int box": _ibox("int8", 0.5, 1),
    "int out of dtype range": _ibox("int8", 0, 300),
    "int in bool box": _ibox("bool", 0, 1),
    "negative n": {"type": "Discrete", "n": -1, "start": 0, "dtype": "int64"},
    "zero n": {"type": "Discrete", "n": 0, "start": 0, "dtype": "int64"},
    "bool n": {"type": "Discrete", "n": True, "start": 0, "dtype": "int64"},
    "float dtype discrete": {"type": "Discrete", "n": 2, "start": 0, "dtype": "float32"},
    "discrete overflow": {"type": "Discrete", "n": 200, "start": 0, "dtype": "int8"},
    "multidiscrete negative": _md([3, -1], [0, 0]),
    "multidiscrete ragged": _md([[3], [1, 2]], [[0], [0, 0]]),
    "multidiscrete start shape": _md([3, 2], [0]),
    "multibinary negative": {"type": "MultiBinary", "n": -3},
    "multibinary huge": {"type": "MultiBinary", "n": [2**20, 2**20]},
    "text negative": {"type": "Text", "min_length": -1, "max_length": 3, "charset": "ab"},
    "text min above max": {"type": "Text", "min_length": 5, "max_length": 3, "charset": "ab"},
    "text charset not str": {"type": "Text", "min_length": 0, "max_length": 3, "charset": ["ab"]},
    "dict duplicate keys": {"type": "Dict", "keys": ["a", "a"], "spaces": [_deep(0), _deep(0)]},
    "dict length mismatch": {"type": "Dict", "keys": ["a"], "spaces": []},
    "dict key not str": {"type": "Dict", "keys": [1], "spaces": [_deep(0)]},
    "too deep": _deep(40),
}


@pytest.mark.parametrize("desc", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_descriptions_rejected(desc: Any) -> None:
    with pytest.raises(SpaceMappingError):
        space_from_description(desc)


def test_depth_limit_boundary() -> None:
    assert isinstance(space_from_description(_deep(32)), gs.Tuple)
    with pytest.raises(SpaceMappingError, match="deeper"):
        space_from_description(_deep(33))


def test_public_types() -> None:
    ss = observation_space_from_schema(ColorObservation.model_json_schema())
    assert isinstance(ss, SchemaSpace) and isinstance(ss.codec, FieldCodec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ss.single_field = "x"  # type: ignore[misc]  # frozen
    assert len(TEXT_CHARSET) == 98 and " " in TEXT_CHARSET and "\x0b" not in TEXT_CHARSET


def test_a_string_field_holds_any_unicode_string_and_samples_printable_ascii():
    space = field_space({"type": "string", "maxLength": 12}, {}, "message", "action")[0]
    assert type(space) is UnicodeText
    for text in ("", "plain", "café", "“q” — 🙂", "日本語"):
        assert space.contains(text)
    for bad in ("x" * 13, "\ud800", b"bytes", 7, None):
        assert not space.contains(bad)
    assert all(set(space.sample()) <= set(TEXT_CHARSET) for _ in range(20))
    assert space != gs.Text(12, min_length=0, charset=TEXT_CHARSET) and space == UnicodeText(12)


def test_a_string_field_without_max_length_holds_long_strings_and_samples_short_ones():
    space = field_space({"type": "string"}, {}, "code", "action")[0]
    assert space.contains("x" * 1_000_000) and space.max_length == 2**31 - 1
    assert max(len(space.sample()) for _ in range(50)) <= 4096
    assert len(space.sample(mask=(10_000, None))) == 10_000  # an asked-for length is kept
    long_minimum = UnicodeText(2**31 - 1, min_length=5_000)
    assert len(long_minimum.sample()) == 5_000 and long_minimum.contains(long_minimum.sample())


def test_lists_of_strings_objects_and_enum_values_map_to_sequences() -> None:
    class Message(BaseModel):
        sender: int
        text: str

    class ChatObservation(Observation):
        moves: List[str]
        history: List[Message]
        votes: List[Literal["yes", "no"]]
        grid: List[List[str]]
        scores: List[float] = Field(min_length=2, max_length=2)

    ss = observation_space_from_schema(ChatObservation.model_json_schema())
    space = ss.space
    assert space["moves"] == gs.Sequence(UnicodeText(2**31 - 1), stack=False)
    assert isinstance(space["history"].feature_space, gs.Dict) and space["votes"].feature_space == gs.Discrete(2)
    assert space["grid"] == gs.Sequence(gs.Sequence(UnicodeText(2**31 - 1), stack=False), stack=False)
    assert isinstance(space["scores"], gs.Box)  # numbers stay arrays
    payload = {
        "moves": ["e4", "é5"],
        "history": [{"sender": 1, "text": "hi"}],
        "votes": ["no", "yes", "no"],
        "grid": [["a"], [], ["b", "c"]],
        "scores": [0.5, 1.5],
    }
    value = ss.from_wire(payload)
    assert value["moves"] == ("e4", "é5") and value["votes"] == (1, 0, 1) and value["grid"] == (("a",), (), ("b", "c"))
    assert value["history"][0]["text"] == "hi" and space.contains(value)
    with pytest.raises(SpaceMappingError, match="'moves'"):
        ss.from_wire({**payload, "moves": "e4"})

    class ToolAction(Action):
        args: List[str]

    act = action_space_from_schema(ToolAction.model_json_schema())
    assert act.to_wire(("a", "ü")) == {"args": ["a", "ü"]} and act.space.contains(("a", "ü"))


def test_a_top_level_field_no_space_holds_goes_in_info_and_the_rest_is_mapped(caplog) -> None:
    from typing import Tuple

    class MixedTuple(Observation):
        mixed: Tuple[float, str]  # items of different types: no Box, and values travel as lists
        x: float

    with caplog.at_level("WARNING", logger="openenv_gym.spaces"):
        ss = observation_space_from_schema(MixedTuple.model_json_schema())
    assert ss.single_field == "x" and ss.info_fields == ("mixed",)
    assert ss.info_of({"x": 0.5, "mixed": [1.5, "a"]}) == {"mixed": [1.5, "a"]}
    assert "'mixed'" in caplog.text and "goes in info" in caplog.text

    class OnlyMixed(Observation):
        mixed: Tuple[float, str]

    with pytest.raises(SpaceMappingError, match="'mixed'"):  # nothing else: still an error, with the way out
        observation_space_from_schema(OnlyMixed.model_json_schema())


def test_free_form_content_inside_a_field_is_json_text() -> None:
    class Board(Observation):
        messages: List[Dict[str, str]]
        cells: List[List[Any]]
        result: Optional[Union[dict, bool]] = None  # top level: goes to info
        note: str = ""

    ss = observation_space_from_schema(Board.model_json_schema())
    assert ss.info_fields == ("result",)
    assert ss.space["messages"] == gs.Sequence(JsonText(), stack=False)
    assert ss.space["cells"] == gs.Sequence(gs.Sequence(JsonText(), stack=False), stack=False)
    value = ss.from_wire({"messages": [{"role": "user", "content": "hé"}], "cells": [[1, "x", None]], "note": "n"})
    assert value["messages"] == ('{"role":"user","content":"hé"}',) and value["cells"] == (("1", '"x"', "null"),)
    assert ss.space.contains(value)

    class Call(Action):
        tool_name: str
        arguments: Dict[str, Any]

    act = action_space_from_schema(Call.model_json_schema())
    assert act.space["arguments"] == JsonText() and act.space["arguments"].sample() == "{}"
    assert act.to_wire({"tool_name": "add", "arguments": '{"a": 1, "b": [2]}'}) == {
        "tool_name": "add",
        "arguments": {"a": 1, "b": [2]},
    }
    with pytest.raises(SpaceMappingError, match="'arguments'.*not JSON text"):
        act.to_wire({"tool_name": "add", "arguments": "{a: 1"})


def test_open_arrays_inside_list_items_are_sequences_and_explicit_sequences_are_accepted() -> None:
    class Scored(BaseModel):
        content: str
        scores: List[float]

    class Feed(Observation):
        prompt: str
        messages: List[Scored]
        info: Dict[str, Any]

    schema = Feed.model_json_schema()
    ss = observation_space_from_schema(schema)
    assert not ss.is_open and ss.info_fields == ("info",)
    value = ss.from_wire({"prompt": "p", "messages": [{"content": "a", "scores": [1.0, 2.0]}], "info": {}})
    assert [float(x) for x in value["messages"][0]["scores"]] == [1.0, 2.0] and ss.space.contains(value)
    # The derived space given back explicitly, or one with a narrower item space: same codecs, same info fields.
    for explicit in (
        ss.space,
        gs.Dict(
            {
                "prompt": gs.Text(50, charset=TEXT_CHARSET),
                "messages": gs.Sequence(
                    gs.Dict({"content": UnicodeText(100), "scores": gs.Sequence(gs.Box(-10, 10, (), np.float32), stack=False)}),
                    stack=False,
                ),
            }
        ),
    ):
        given = space_codec(explicit, schema=schema)
        assert given.info_fields == ("info",)
        assert (
            given.from_wire({"prompt": "p", "messages": [{"content": "a", "scores": [1.0]}], "info": {}})["messages"][0]["content"] == "a"
        )


def test_unbounded_text_refuses_to_flatten_clearly() -> None:
    unbounded = UnicodeText(2**31 - 1)
    for call in (lambda: gs.flatdim(unbounded), lambda: gs.flatten_space(unbounded), lambda: gs.flatten(unbounded, "x")):
        with pytest.raises(ValueError, match="maxLength"):
            call()
    bounded = UnicodeText(4)
    assert gs.flatdim(bounded) == 4 and gs.flatten(bounded, "ab").shape == (4,)
    with pytest.raises(ValueError, match="no flat form"):
        gs.flatten(bounded, "é")  # outside the charset: no index to flatten it to


def test_a_list_is_coerced_to_the_tuple_a_sequence_holds() -> None:
    from openenv_gym._actions import coerce_action

    space = gs.Sequence(UnicodeText(10), stack=False)
    assert coerce_action(space, ["a", "é"]) == ("a", "é") and space.contains(coerce_action(space, ["a", "é"]))
    nested = gs.Dict({"args": space})
    assert nested.contains(coerce_action(nested, {"args": ["x"]}))


def test_a_list_whose_length_varies_is_refused_with_the_fix_named_and_the_fix_works() -> None:
    class Game(Observation):
        board: List[int]
        legal_actions: List[int]

    schema = Game.model_json_schema()
    first = {"board": [0] * 9, "legal_actions": list(range(9))}
    ss = fix_open_shapes(observation_space_from_schema(schema), first)
    with pytest.raises(SpaceMappingError, match="first observation's.*Sequence"):
        ss.from_wire({"board": [0] * 9, "legal_actions": [1, 2]})
    varying = gs.Dict({"board": gs.Box(-10, 10, (9,), np.int64), "legal_actions": gs.Sequence(gs.Box(0, 8, (), np.int64), stack=False)})
    given = space_codec(varying, schema=schema)
    value = given.from_wire({"board": [0] * 9, "legal_actions": [1, 2]})
    assert [int(a) for a in value["legal_actions"]] == [1, 2] and varying.contains(value)


def test_an_action_that_is_one_of_several_models_is_its_json_text() -> None:
    class Move(BaseModel):
        kind: Literal["move"] = "move"
        to: int

    class Say(BaseModel):
        kind: Literal["say"] = "say"
        text: str

    schema = TypeAdapter(Annotated[Union[Move, Say], Field(discriminator="kind")]).json_schema()
    ss = action_space_from_schema(schema)
    assert ss.space == JsonText() and ss.space.sample() == "{}"
    assert ss.to_wire('{"kind": "say", "text": "hé"}') == {"kind": "say", "text": "hé"}
    with pytest.raises(SpaceMappingError, match="JSON object"):
        ss.to_wire("[1, 2]")


def test_an_open_array_null_in_the_first_observation_goes_to_info() -> None:
    class Page(Observation):
        text: str
        screenshot: Optional[List[List[int]]] = None

    ss = fix_open_shapes(observation_space_from_schema(Page.model_json_schema()), {"text": "t", "screenshot": None})
    assert ss.space == gs.Dict({"text": UnicodeText(2**31 - 1)}) and ss.info_fields == ("screenshot",)
    assert ss.info_of({"text": "t", "screenshot": [[1, 2]]}) == {"screenshot": [[1, 2]]}
    assert ss.from_wire({"text": "u", "screenshot": [[1, 2]]}) == {"text": "u"}
    with pytest.raises(SpaceMappingError, match="first observation has no value"):  # the only field: no space left
        only = observation_space_from_schema(Page.model_json_schema(), obs_key="screenshot")
        fix_open_shapes(only, {"text": "t", "screenshot": None})


def test_variable_fields_must_name_open_lists_of_numbers() -> None:
    class Board(BaseModel):
        legal: List[int]

    class Game(Observation):
        board: Board
        text: str
        fixed: List[int] = Field(min_length=2, max_length=2)

    schema = Game.model_json_schema()
    ok = observation_space_from_schema(schema, variable="board.legal")
    assert isinstance(ok.space["board"]["legal"], gs.Sequence)
    for wrong in ("board.nope", "reward", "text", "fixed", "board", "legal"):
        with pytest.raises(SpaceMappingError, match="variable_fields"):
            observation_space_from_schema(schema, variable=(wrong,))


def test_json_text_depth_counts_the_levels_around_its_field() -> None:
    class Call(BaseModel):
        args: Dict[str, Any]

    class Plan(Action):
        calls: List[Call]

    ss = action_space_from_schema(Plan.model_json_schema())  # args sits in a list and an object: 22 levels left
    nested = lambda depth: '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)  # noqa: E731
    assert ss.to_wire(({"args": nested(22)},))["calls"][0]["args"]
    with pytest.raises(SpaceMappingError, match="deeper than 22"):
        ss.to_wire(({"args": nested(23)},))


class CellAction(Action):
    """Shaped as Minesweeper's action: the kind of move is a string held to a pattern."""

    row: int = Field(ge=0, le=7)
    col: int = Field(ge=0, le=7)
    action_type: str = Field(pattern=r"^(reveal|flag)$")


class PatternObservation(Observation):
    status: str = Field(default="ok", pattern=r"^(?:ok|game\.over)$")
    word: str = Field(default="abc", pattern=r"^[a-z]+$")  # not a choice of words: text
    anywhere: str = Field(default="reveal", pattern=r"reveal|flag")  # unanchored: "contains", text
    phase: str = Field(default="", pattern=r"^(setup|play)$")  # pydantic does not check the default: text


def test_a_pattern_that_is_a_choice_of_words_is_an_enum() -> None:
    ss = action_space_from_schema(CellAction.model_json_schema())
    assert ss.space["action_type"] == gs.Discrete(2)
    assert ss.to_wire({"row": np.int64(1), "col": np.int64(2), "action_type": np.int64(1)}) == {
        "row": 1,
        "col": 2,
        "action_type": "flag",
    }
    ss.space.seed(0)
    kinds = set()
    for _ in range(20):  # every sample is a move the model accepts (a text sample never was)
        wire = ss.to_wire(ss.space.sample())
        kinds.add(CellAction.model_validate(wire).action_type)
    assert kinds == {"reveal", "flag"}


def test_only_anchored_patterns_of_literal_words_are_enums() -> None:
    ss = observation_space_from_schema(PatternObservation.model_json_schema())
    assert ss.space["status"] == gs.Discrete(2)
    assert ss.from_wire({"status": "game.over", "word": "x", "anywhere": "a reveal", "phase": "play"})["status"] == 1
    assert isinstance(ss.space["word"], UnicodeText) and isinstance(ss.space["anywhere"], UnicodeText)
    assert isinstance(ss.space["phase"], UnicodeText)
    assert ss.from_wire(PatternObservation().model_dump())["phase"] == ""
    with pytest.raises(SpaceMappingError, match="status"):
        ss.from_wire({"status": "gameXover", "word": "x", "anywhere": "", "phase": ""})


def test_a_received_discrete_value_outside_its_space_is_an_error() -> None:
    ss = space_codec(gs.Dict({"die": gs.Discrete(6, start=1)}))
    assert ss.from_wire({"die": 6})["die"] == 6
    for bad in (0, 7, 99):
        with pytest.raises(SpaceMappingError, match="outside"):
            ss.from_wire({"die": bad})


def test_a_bounded_sequence_samples_and_holds_only_lengths_in_its_bounds():
    from openenv_gym import BoundedSequence

    space = BoundedSequence(gym.spaces.Discrete(5), min_length=1, max_length=2, seed=0)
    lengths = {len(space.sample()) for _ in range(200)}
    assert lengths == {1, 2}
    assert space.contains((4,)) and not space.contains(()) and not space.contains((1, 2, 3))
    assert len(space.sample(mask=(2, None))) == 2  # a length asked for is kept
    assert len(space.sample(probability=(None, np.full(5, 0.2)))) in (1, 2)
    assert space == BoundedSequence(gym.spaces.Discrete(5), min_length=1, max_length=2)
    assert space != BoundedSequence(gym.spaces.Discrete(5), min_length=0, max_length=2)
    assert space != gym.spaces.Sequence(gym.spaces.Discrete(5))
    with pytest.raises(ValueError):
        BoundedSequence(gym.spaces.Discrete(5), min_length=3, max_length=2)


def test_a_stock_terminated_field_is_the_flag_only_in_the_shape_of_a_served_gymnasium_env():
    # Next to "observation" and "truncated" (a Gymnasium env served over OpenEnv), a bool "terminated"
    # is Gymnasium's flag and leaves the observation; in any other env it is the env's own field.
    from openenv_gym.remote import resolve_spaces

    class GymShaped(Observation):
        observation: List[float] = Field(default_factory=list, min_length=2, max_length=2)
        truncated: bool = False
        terminated: bool = False

    class Own(Observation):
        x: float = 0.0
        truncated: bool = False
        terminated: bool = False

    class Act(Action):
        move: int = 0

    def resolve(model):
        return resolve_spaces({"observation": model.model_json_schema(), "action": Act.model_json_schema()})

    served = resolve(GymShaped)
    assert served.terminated_key == "terminated" and served.truncated_key == "truncated"
    assert isinstance(served.observation.space, gs.Box)
    own = resolve(Own)
    assert own.terminated_key is None and own.truncated_key == "truncated"
    assert isinstance(own.observation.space, gs.Dict) and "terminated" in own.observation.space.spaces


_ROW_CODECS = {
    "float32 box": gs.Box(-np.inf, np.inf, (2,), np.float32),
    "uint8 box": gs.Box(0, 255, (2,), np.uint8),
    "int64 box": gs.Box(-(2**62), 2**62, (2,), np.int64),
    "uint64 box": gs.Box(0, 2**63, (2,), np.uint64),
    "scalar box": gs.Box(-1.0, 1.0, (), np.float64),
    "multibinary": gs.MultiBinary(2),
    "multidiscrete": gs.MultiDiscrete([3, 3]),
}
_numbers = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**65), 2**65)
    | st.sampled_from([0, 1, 2, 255, 256, -1, 0.5, 1.0, 2.0**53, True, False])
)
_row_values = st.one_of(
    st.lists(_numbers, min_size=2, max_size=2),
    st.lists(_numbers, min_size=0, max_size=3),
    _numbers,
    st.none(),
    st.text(max_size=2),
    st.lists(st.lists(_numbers, min_size=1, max_size=2), min_size=2, max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(_ROW_CODECS)), rows=st.lists(_row_values, min_size=1, max_size=4))
def test_from_wire_rows_is_from_wire_of_each_value_stacked_or_declines(name, rows) -> None:
    codec = space_codec(_ROW_CODECS[name], key="obs").codec
    stacked = codec.from_wire_rows(rows)
    try:
        each = [codec.from_wire(v) for v in rows]
    except SpaceMappingError:
        each = None
    if stacked is not None:  # (declining is always allowed: the caller converts value by value)
        assert each is not None, "stacked rows that from_wire refuses"
        expected = np.stack(each)
        assert stacked.dtype == expected.dtype and stacked.shape == expected.shape
        np.testing.assert_array_equal(stacked, expected)


def test_from_wire_rows_takes_the_common_case_at_once() -> None:
    box = space_codec(gs.Box(-np.inf, np.inf, (4,), np.float32), key="obs").codec
    rows = [[0.1, -0.2, 0.3, 1.5e30], [1, 2, 3, 4]]
    stacked = box.from_wire_rows(rows)
    assert stacked is not None and stacked.dtype == np.float32 and stacked.shape == (2, 4)
    np.testing.assert_array_equal(stacked, np.array(rows, dtype=np.float32))
    assert box.from_wire_rows([[0.1, -0.2, 0.3, 0.4], None]) is None  # (a null: value by value)
    assert box.from_wire_rows([[0.1, -0.2, 0.3, 0.4], [1.0, 2.0]]) is None  # (ragged)
    ints = space_codec(gs.Box(0, 255, (2,), np.uint8), key="obs").codec
    assert ints.from_wire_rows([[1, 2], [3, 300]]) is None  # (300 is no uint8: from_wire says why)
    assert space_codec(gs.Discrete(3), key="obs").codec.from_wire_rows([1, 2]) is None  # (arrays only)


# ---------------------------------------------------------------------------
# Any /schema a peer sends maps or is refused with SpaceMappingError
# ---------------------------------------------------------------------------

_SCHEMA_WORDS = (
    "type",
    "properties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "$ref",
    "$defs",
    "anyOf",
    "oneOf",
    "allOf",
    "required",
    "minLength",
    "maxLength",
    "default",
    "additionalProperties",
    "title",
    "a",
    "b",
    "A",
)
_DESC_WORDS = (
    "type",
    "dtype",
    "shape",
    "low",
    "high",
    "n",
    "start",
    "nvec",
    "min_length",
    "max_length",
    "charset",
    "keys",
    "spaces",
    "feature_space",
    "stack",
    "version",
    "observation_space",
    "action_space",
    "obs_key",
    "action_key",
    "truncated_key",
)
_WORDS = (
    "object",
    "array",
    "integer",
    "number",
    "boolean",
    "string",
    "null",
    "#/$defs/A",
    "#",
    "http://x/y",
    "Box",
    "Discrete",
    "MultiDiscrete",
    "MultiBinary",
    "Text",
    "UnicodeText",
    "Dict",
    "Tuple",
    "Sequence",
    "float32",
    "int64",
    "uint8",
    "bool",
    "object_",
    "inf",
    "-inf",
    "nan",
)
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(_WORDS),
    st.text(max_size=4),
)


def _peer_json(words):
    """JSON values up to 30 leaves, whose maps have keys from ``words``."""

    def extend(kids):
        return st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(words), kids, max_size=5))

    return st.recursive(_leaves, extend, max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(schema=st.dictionaries(st.sampled_from(_SCHEMA_WORDS), _peer_json(_SCHEMA_WORDS), max_size=5))
def test_any_json_schema_maps_or_is_refused_clearly(schema) -> None:
    for build in (observation_space_from_schema, action_space_from_schema):
        try:
            build(schema)
        except SpaceMappingError:
            pass


@settings(max_examples=400, deadline=None)
@given(desc=st.dictionaries(st.sampled_from(_DESC_WORDS), _peer_json(_DESC_WORDS), max_size=6))
def test_any_space_description_maps_or_is_refused_clearly(desc) -> None:
    try:
        space = space_from_description(desc)
    except SpaceMappingError:
        return
    assert isinstance(space, gs.Space)


@settings(max_examples=300, deadline=None)
@given(
    schema=st.fixed_dictionaries(
        # (what fetch_schema lets through: an object whose "observation" is one)
        {"observation": st.dictionaries(st.sampled_from(_SCHEMA_WORDS), _peer_json(_SCHEMA_WORDS), max_size=5)},
        optional={
            "action": _peer_json(_SCHEMA_WORDS),
            "reset_observation": _peer_json(_SCHEMA_WORDS),
            "x-openenv-gym": st.dictionaries(st.sampled_from(_DESC_WORDS), _peer_json(_DESC_WORDS), max_size=6),
        },
    )
)
def test_any_schema_reply_gives_spaces_or_a_clear_refusal(schema) -> None:
    from openenv_gym.remote import resolve_spaces

    try:
        resolved = resolve_spaces(schema)
    except SpaceMappingError:
        return
    assert isinstance(resolved.observation.space, gs.Space) and isinstance(resolved.action.space, gs.Space)


def test_a_malformed_extension_block_is_refused_clearly() -> None:
    from openenv_gym.remote import resolve_spaces

    schema = {"observation": {"properties": {"obs": {"type": "number"}}}, "action": {"properties": {"a": {"type": "integer"}}}}
    assert resolve_spaces({**schema, "x-openenv-gym": {"obs_key": "obs"}}).observation.single_field == "obs"
    for key in ("obs_key", "action_key", "truncated_key", "terminated_key"):
        with pytest.raises(SpaceMappingError, match=f"x-openenv-gym.{key} must be a string"):
            resolve_spaces({**schema, "x-openenv-gym": {key: ["obs"]}})


_WIRE_SPACES = {
    "box": gs.Box(-1, 1, (2,), np.float32),
    "uint8 box": gs.Box(0, 255, (2, 2), np.uint8),
    "discrete": gs.Discrete(3, start=-1),
    "multibinary": gs.MultiBinary(3),
    "multidiscrete": gs.MultiDiscrete([2, 3]),
    "text": gs.Text(5),
    "dict": gs.Dict({"a": gs.Discrete(2), "b": gs.Box(0, 1, (2,))}),
    "tuple": gs.Tuple((gs.Discrete(2), gs.Text(3))),
    "sequence": gs.Sequence(gs.Discrete(4)),
    "stacked sequence": gs.Sequence(gs.Box(0, 1, (2,)), stack=True),
}
_WIRE_SCHEMA = {
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 4},
        "b": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "c": {"enum": ["red", "green"]},
        "x": {"type": "object", "properties": {"y": {"type": "boolean"}}, "required": ["y"]},
        "y": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
            "minItems": 2,
            "maxItems": 2,
        },
        "obs": {"type": "object"},
        "s": {"type": "string", "maxLength": 3},
    },
    "required": ["a", "c"],
}
_WIRE_CODECS = {name: space_codec(space, key="obs") for name, space in _WIRE_SPACES.items()}
_WIRE_CODECS["observation schema"] = observation_space_from_schema(_WIRE_SCHEMA)
_WIRE_CODECS["action schema"] = action_space_from_schema(_WIRE_SCHEMA)
_FIELD_NAMES = ("a", "b", "c", "x", "y", "obs", "s")


@settings(max_examples=500, deadline=None)
@given(
    name=st.sampled_from(sorted(_WIRE_CODECS)),
    payload=st.one_of(st.dictionaries(st.sampled_from(_FIELD_NAMES), _peer_json(_FIELD_NAMES), max_size=7), _peer_json(_FIELD_NAMES)),
)
def test_any_received_payload_is_read_into_the_space_or_refused_clearly(name, payload) -> None:
    """What a server sends as an observation (or a client as an action) is a value of the space's kind, or a SpaceMappingError."""
    sspace = _WIRE_CODECS[name]
    try:
        value = sspace.from_wire(payload)
    except SpaceMappingError:
        return
    space = sspace.space
    if isinstance(space, (gs.Box, gs.MultiBinary, gs.MultiDiscrete)):
        assert isinstance(value, np.ndarray) and value.shape == space.shape and value.dtype == space.dtype
    elif isinstance(space, gs.Discrete):
        assert isinstance(value, np.integer) and space.contains(value)
    elif isinstance(space, gs.Dict):
        assert isinstance(value, dict) and set(value) == set(space.spaces)
    elif isinstance(space, gs.Tuple):
        assert isinstance(value, tuple) and len(value) == len(space.spaces)
    elif isinstance(space, gs.Text):
        assert isinstance(value, str)


# ---------------------------------------------------------------------------
# The rules for the shapes of real OpenEnv envs (docs/guides/openenv-envs.md)
# ---------------------------------------------------------------------------


def test_a_null_enum_has_a_value_of_its_own_after_the_others() -> None:
    class Kind(str, enum.Enum):
        FIRST = "first"
        SECOND = "second"

    class Problem(BaseModel):
        kind: Kind
        message: str

    class Reply(Observation):
        maybe: Optional[Literal["a", "b"]] = None
        problem: Optional[Problem] = None
        always: Literal["x", "y"]

    ss = observation_space_from_schema(Reply.model_json_schema())
    assert ss.space["maybe"] == gs.Discrete(3) and ss.space["always"] == gs.Discrete(2)
    assert ss.space["problem"]["kind"] == gs.Discrete(3)  # (null through the Optional model around it)
    value = ss.from_wire({"maybe": None, "problem": None, "always": "y"})
    assert value["maybe"] == 2 and value["problem"]["kind"] == 2 and value["always"] == 1
    value = ss.from_wire({"maybe": "a", "problem": {"kind": "first", "message": "m"}, "always": "x"})
    assert value["maybe"] == 0 and value["problem"]["kind"] == 0
    assert ss.from_wire({"always": "x"})["maybe"] == 2  # missing: as null

    class Act(Action):
        maybe: Optional[Literal["a", "b"]] = None

    act = action_space_from_schema(Act.model_json_schema())
    assert act.space == gs.Discrete(3) and act.to_wire(np.int64(1)) == {"maybe": "b"}
    assert act.to_wire(np.int64(2)) == {"maybe": None}  # null, sent as null


def test_an_integer_or_a_number_list_of_the_action_whose_schema_says_no_range_or_length_is_never_sampled() -> None:
    from gymnasium.vector.utils import batch_space

    from openenv_gym.spaces import UnboundedInteger, UnsizedSequence

    class Move(Action):
        move: int
        level: Optional[int] = None  # optional: the server has a default, so it samples
        steps: int = Field(ge=0)  # one bound: samples from it

    ss = action_space_from_schema(Move.model_json_schema())
    assert isinstance(ss.space["move"], UnboundedInteger) and not isinstance(ss.space["level"], UnboundedInteger)
    assert ss.space["move"] == gs.Box(-np.inf, np.inf, (), np.int64)  # the same values as before
    assert ss.space.contains({"move": np.array(-7), "level": np.array(1), "steps": np.array(0)})
    with pytest.raises(SpaceMappingError, match="action field 'move'.*no range.*action_space="):
        ss.space.sample()
    assert batch_space(ss.space["move"], 4).shape == (4,)
    with pytest.raises(SpaceMappingError):
        batch_space(ss.space, 4).sample()

    class Control(Action):
        values: List[float] = Field(default_factory=list)
        pair: List[float] = Field(min_length=2, max_length=2)
        some: List[int] = Field(default_factory=list, max_length=3)

    control = action_space_from_schema(Control.model_json_schema())
    assert isinstance(control.space["values"], UnsizedSequence) and control.space["pair"].shape == (2,)
    assert not isinstance(control.space["some"], UnsizedSequence)  # (maxItems: any length up to it is the env's)
    with pytest.raises(SpaceMappingError, match="list of numbers whose schema gives no length"):
        control.space["values"].sample()
    assert control.to_wire({"values": (0.5,), "pair": np.array([1.0, 2.0]), "some": ()}) == {"values": [0.5], "pair": [1.0, 2.0]}


def _resolve(obs: type, act: type, first: dict | None = None, **kwargs):
    from openenv_gym.remote import resolve_spaces

    return resolve_spaces({"observation": obs.model_json_schema(), "action": act.model_json_schema()}, first_observation=first, **kwargs)


def test_legal_actions_go_to_info_and_bound_the_one_required_integer_of_the_action() -> None:
    class Obs(Observation):
        board: List[int] = Field(default_factory=list)
        legal_actions: List[int] = Field(default_factory=list)

    class Act(Action):
        action_id: int
        game_name: str = "catch"

    before = _resolve(Obs, Act)
    assert before.needs_first_observation and before.legal_actions == "legal_actions"
    assert "legal_actions" in before.observation.info_fields
    spaces_ = _resolve(Obs, Act, {"board": [0, 0, 1], "legal_actions": [0, 1, 2]})
    assert not spaces_.needs_first_observation
    assert spaces_.action.space == gs.Discrete(3) and spaces_.action.fields == ("action_id",)  # game_name: the server's
    assert spaces_.observation.space == gs.Box(-np.inf, np.inf, (3,), np.int64)
    info = spaces_.info_of({"board": [0, 1, 0], "legal_actions": [2, 0, 7]})
    assert info["legal_actions"] == [2, 0, 7] and info["action_mask"].tolist() == [1, 0, 1]  # (7: out of range, left out)
    assert info["action_mask"].dtype == np.int8
    given = _resolve(Obs, Act, {"board": [0], "legal_actions": [0]}, action_space=gs.Discrete(5), action_key="action_id")
    assert given.action_mask_size == 5  # the user's Discrete is masked too

    class OnlyLegal(Observation):
        legal_actions: List[int] = Field(default_factory=list)

    alone = _resolve(OnlyLegal, Act, {"legal_actions": [0, 1]})
    assert isinstance(alone.observation.space, gs.Sequence)  # the only field: the observation, of varying length


def test_a_map_of_number_lists_and_an_empty_first_list_take_their_shape_from_the_first_observation() -> None:
    class Obs(Observation):
        observations: Dict[str, List[float]] = Field(default_factory=dict)
        tokens: List[int] = Field(default_factory=list)
        pixels: Optional[str] = None
        extra: Dict[str, Any] = Field(default_factory=dict)

    class Act(Action):
        message: str

    before = _resolve(Obs, Act)
    assert before.needs_first_observation
    first = {"observations": {"velocity": [0.0, 1.0], "position": [1.0]}, "tokens": [], "pixels": None, "extra": {"a": 1}}
    spaces_ = _resolve(Obs, Act, first)
    space = spaces_.observation.space
    assert space["observations"] == gs.Dict(
        position=gs.Box(-np.inf, np.inf, (1,), np.float32), velocity=gs.Box(-np.inf, np.inf, (2,), np.float32)
    )
    assert isinstance(space["tokens"], gs.Sequence) and space["pixels"] == UnicodeText(2**31 - 1)
    assert "extra" in spaces_.observation.info_fields  # (a map of anything stays in info)
    value = spaces_.observation.from_wire({**first, "tokens": [5, 6]})
    assert value["observations"]["velocity"].tolist() == [0.0, 1.0] and [int(t) for t in value["tokens"]] == [5, 6]
    empty = _resolve(Obs, Act, {**first, "observations": {}})
    assert "observations" in empty.observation.info_fields  # (no keys to take: in info)


def test_fields_the_schema_does_not_name_go_to_info_and_obs_key_keeps_the_others() -> None:
    class Obs(Observation):
        text: str = ""
        score: float = 0.0

    class Act(Action):
        message: str

    spaces_ = _resolve(Obs, Act)
    payload = {"text": "t", "score": 1.0, "tools": [{"name": "add"}], "Text": "alias?"}
    assert spaces_.adds_info(payload) and not spaces_.adds_info({"text": "t", "score": 1.0})
    assert spaces_.info_of(payload) == {"tools": [{"name": "add"}]}  # ("Text": the known field's other spelling)
    keyed = _resolve(Obs, Act, obs_key="text")
    assert keyed.observation.space == UnicodeText(2**31 - 1) and keyed.info_of({"text": "t", "score": 2.5}) == {"score": 2.5}


def test_a_dm_env_action_spec_in_the_state_sizes_an_action_list_of_no_length() -> None:
    from openenv_gym.spaces import UnsizedSequence

    class Obs(Observation):
        x: float = 0.0

    class Act(Action):
        values: List[float] = Field(default_factory=list)

    before = _resolve(Obs, Act)
    assert before.needs_first_observation and before.needs_state and isinstance(before.action.space, UnsizedSequence)
    spec = {"shape": [2], "dtype": "float64", "minimum": [-1.0, 0.0], "maximum": [1.0, 2.0], "name": "force"}
    sized = _resolve(Obs, Act, {"x": 0.0}, state={"action_spec": spec})
    assert sized.action.space == gs.Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), (2,), np.float64)
    assert sized.action.to_wire(np.array([0.5, 1.5])) == {"values": [0.5, 1.5]}
    assert not sized.needs_state
    for bad in (
        {},
        {"shape": [2, 2]},
        {"shape": [2], "minimum": [0.0], "maximum": [1.0, 1.0]},
        {"shape": [1], "minimum": 1.0, "maximum": 0.0},
    ):
        assert isinstance(_resolve(Obs, Act, {"x": 0.0}, state={"action_spec": bad}).action.space, UnsizedSequence)
    scalar = _resolve(Obs, Act, {"x": 0.0}, state={"action_spec": {"shape": [3], "minimum": -2, "maximum": 2}})
    assert scalar.action.space == gs.Box(-2.0, 2.0, (3,), np.float64)

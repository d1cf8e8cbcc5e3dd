"""Records: a chapter's quoted numbers, saved by `make refresh`, checked by every other
run."""

from __future__ import annotations

import json

import pytest

from ratelimit.lab import records


@pytest.fixture
def saving(monkeypatch, tmp_path):
    monkeypatch.setenv(records.ENV, "1")
    return tmp_path


def _record(directory, **values):
    rec = records.Chapter("09_example", backend="embedded", directory=directory)
    for name, (value, fmt) in values.items():
        rec.put(name, value, fmt, f"what {name} is")
    return rec


def test_refresh_writes_every_value_with_its_quoted_text(saving):
    _record(saving, peak=(12, "d"), share=(0.12345, ".1%"), size=(1234567.0, ",.0f"))
    stored = json.loads((saving / "09_example.json").read_text())
    assert stored["chapter"] == "09_example"
    assert stored["run"]["backend"] == "embedded"
    assert {n: v["text"] for n, v in stored["values"].items()} == {
        "peak": "12",
        "share": "12.3%",
        "size": "1,234,567",
    }
    assert stored["values"]["share"]["value"] == 0.12345
    assert stored["values"]["peak"]["what"] == "what peak is"


def test_a_refresh_replaces_the_old_record_whole(saving):
    _record(saving, old=(1, "d"), kept=(2, "d"))
    _record(saving, kept=(3, "d"))
    stored = json.loads((saving / "09_example.json").read_text())
    assert set(stored["values"]) == {"kept"}
    assert stored["values"]["kept"]["text"] == "3"


def test_a_checked_run_passes_when_the_quoted_text_is_the_same(saving, monkeypatch):
    _record(saving, share=(0.12345, ".1%"))
    monkeypatch.setenv(records.ENV, "0")
    rec = _record(saving, share=(0.12349, ".1%"))  # same text, 12.3%
    assert rec.text("share") == "12.3%"


def test_a_checked_run_fails_on_a_different_number_and_names_both(saving, monkeypatch):
    _record(saving, peak=(12, "d"))
    monkeypatch.setenv(records.ENV, "0")
    with pytest.raises(records.RecordMismatch, match=r"peak = 11.*says 12.*make refresh"):
        _record(saving, peak=(11, "d"))


def test_a_checked_run_fails_on_a_number_never_recorded(saving, monkeypatch):
    _record(saving, peak=(12, "d"))
    monkeypatch.setenv(records.ENV, "0")
    with pytest.raises(records.RecordMismatch, match="no committed record 'new'"):
        _record(saving, new=(1, "d"))


def test_a_checked_run_without_records_says_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.setenv(records.ENV, "0")
    with pytest.raises(FileNotFoundError, match="make refresh CHAPTERS=notebooks/09_example"):
        records.Chapter("09_example", directory=tmp_path)


def test_an_interactive_run_neither_reads_nor_writes(tmp_path, monkeypatch):
    monkeypatch.delenv(records.ENV, raising=False)
    rec = _record(tmp_path, peak=(99, "d"))
    assert rec.text("peak") == "99"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda rec: rec.put("Peak", 1), ValueError),
        (lambda rec: rec.put("peak", [1, 2]), TypeError),
        (lambda rec: (rec.put("peak", 1), rec.put("peak", 2)), ValueError),
    ],
    ids=["name", "type", "twice"],
)
def test_bad_records_are_refused(tmp_path, monkeypatch, call, error):
    monkeypatch.delenv(records.ENV, raising=False)
    with pytest.raises(error):
        call(records.Chapter("09_example", directory=tmp_path))


def test_a_chapter_name_must_be_a_notebook_stem(tmp_path):
    with pytest.raises(ValueError, match="notebook's stem"):
        records.Chapter("clock_skew", directory=tmp_path)


def test_numpy_scalars_are_stored_as_plain_numbers(saving):
    np = pytest.importorskip("numpy")
    _record(saving, peak=(np.int64(12), "d"), mean=(np.float64(0.5), ".2f"))
    stored = json.loads((saving / "09_example.json").read_text())["values"]
    assert stored["peak"]["value"] == 12 and stored["mean"]["text"] == "0.50"


def test_templates_quote_only_recorded_names():
    values = {"peak": {"text": "12"}}
    assert records.fill("{peak} in a second", values, "here") == "12 in a second"
    with pytest.raises(KeyError, match=r"here quotes \['mean'\]"):
        records.fill("{peak} and {mean}", values, "here")

import pytest

from stepready_worker.duration import parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("0", 0.0), ("300ms", 0.3), ("2s", 2.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("250us", 0.00025), (" 5s ", 5.0)])
def test_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-1s", "1x", "s", "1s junk"])
def test_bad_durations_name_the_text(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)

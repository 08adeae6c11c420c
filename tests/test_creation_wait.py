"""``MATERIALIZER_CREATION_WAIT_SECONDS``: how long an apply waits for another CREATE's commit.

The drills kill a first CREATE and must not sit out the two-minute default on the next run; the
end-to-end path (a killed CREATE created over after the wait) is tests/test_layout.py's.
"""

from __future__ import annotations

import pytest

from materializer import merge as driver
from materializer.errors import ConfigError


def test_the_default_wait_and_its_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(driver.CREATION_WAIT_ENV, raising=False)
    assert driver.creation_wait_seconds() == driver.CREATION_WAIT_SECONDS == 120
    monkeypatch.setenv(driver.CREATION_WAIT_ENV, "2.5")
    assert driver.creation_wait_seconds() == 2.5
    monkeypatch.setenv(driver.CREATION_WAIT_ENV, " ")
    assert driver.creation_wait_seconds() == 120


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(driver.CREATION_WAIT_ENV, value)
    with pytest.raises(ConfigError, match=f"MATERIALIZER_CREATION_WAIT_SECONDS={value!r}.*seconds"):
        driver.creation_wait_seconds()

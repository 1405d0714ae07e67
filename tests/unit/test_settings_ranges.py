"""Numbers a node cannot run with are refused when the settings load, naming the least (or most)
they take: a flush interval of -1 started a node whose flusher then crashed over and over,
maxMessageSize 0 refused every send, defaultTopicQueueNums 0 made topics of no queue,
clientChannelExpiredTimeout 0 dropped every member at once."""

from __future__ import annotations

import pytest

from shm import settings as settings_module
from shm.settings import SettingsError
from shm.settings_rules import LEAST, MOST


def load(tmp_path, **values):
    return settings_module.load(None, {"storePathRootDir": str(tmp_path), **{k: str(v) for k, v in values.items()}})


@pytest.mark.parametrize("name", sorted(LEAST))
def test_a_number_below_its_least_is_refused_and_the_least_is_taken(tmp_path, name):
    with pytest.raises(SettingsError, match=f"{name} must be"):
        load(tmp_path, **{name: LEAST[name] - 1})
    assert getattr(load(tmp_path, **{name: LEAST[name]}), name) == LEAST[name]


@pytest.mark.parametrize("name", sorted(MOST))
def test_a_number_above_its_most_is_refused(tmp_path, name):
    with pytest.raises(SettingsError, match=f"{name} must be from"):
        load(tmp_path, **{name: MOST[name] + 1})


def test_the_defaults_are_within_every_range(tmp_path):
    settings = load(tmp_path)
    assert all(getattr(settings, n) >= least for n, least in LEAST.items())

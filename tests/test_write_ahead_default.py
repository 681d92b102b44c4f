"""--write-ahead-objects by store (#32, #33): on for s3:// (PUTs billed), off for a local
directory (nothing billed; a partition's own segment answers sooner); the flag and
KAFSCALE_WRITE_AHEAD_OBJECTS set it for any store."""

from __future__ import annotations

import argparse

import pytest

from kafscale.broker import config as broker_config


def _parsed(argv: list[str]) -> broker_config.BrokerConfig:
    parser = argparse.ArgumentParser()
    broker_config.add_arguments(parser)
    return broker_config.from_args(parser.parse_args(argv))


@pytest.mark.parametrize(("argv", "expected"), [
    ([], False),
    (["--storage", "s3://bucket/prefix"], True),
    (["--write-ahead-objects", "true"], True),
    (["--storage", "s3://bucket/prefix", "--write-ahead-objects", "false"], False),
])
def test_the_default_follows_the_store_and_the_flag_wins(tmp_path, argv, expected):
    assert _parsed(["--data-dir", str(tmp_path), *argv]).write_ahead_objects is expected


def test_the_environment_variable_sets_it_for_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFSCALE_WRITE_AHEAD_OBJECTS", "true")
    assert _parsed(["--data-dir", str(tmp_path)]).write_ahead_objects is True

"""Stores by scheme: local, volumes and S3 are stores; any other URI is refused at configuration time.

Before, ``abfss://c@a/log`` became a relative local folder named after the URI (measured), so a
recovery log "on Azure" lived on the driver's disk and died with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import parse_config
from materializer.errors import ConfigError
from materializer.storage import local_path, open_store
from materializer.storage.local import LocalStore


def _config(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pipeline_id": "p",
        "recovery_log": "/tmp/log",
        "staging": "/tmp/staging",
        "bindings": [{"name": "b", "source": {"format": "documents", "path": "src"}, "table": "main.s.t", "key": ["id"]}],
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    "uri, says",
    [
        ("abfss://container@account.dfs.core.windows.net/log", "abfss:// stores are not supported yet"),
        ("gs://bucket/log", "gs:// stores are not supported yet"),
        ("wasbs://c@a.blob.core.windows.net/log", "wasbs:// stores are not supported yet"),
        ("dbfs:/tmp/log", "the DBFS root is not supported: use a volume"),
        ("file://otherhost/log", "a file: URI must name an absolute path"),
        ("file:relative/log", "a file: URI must name an absolute path"),
        ("hdfs://namenode/log", "hdfs:// stores are not supported yet"),
    ],
)
@pytest.mark.parametrize("field", ["recovery_log", "staging", "source"])
def test_an_unsupported_scheme_is_refused_when_the_config_is_loaded(uri: str, says: str, field: str, tmp_path: Path) -> None:
    if field == "source":
        data = _config()
        data["bindings"][0]["source"]["path"] = uri
        where = "bindings[b].source.path"
    else:
        data = _config(**{field: uri})
        where = field
    with pytest.raises(ConfigError) as info:
        parse_config(data, "pipeline.yaml")
    message = str(info.value)
    assert "pipeline.yaml" in message and where in message and uri in message and says in message
    with pytest.raises(ConfigError, match="not supported|must name"):
        open_store(uri)  # and never a local folder named after the URI
    assert not Path(uri.split(":", 1)[0] + ":").exists()


@pytest.mark.parametrize(
    "uri, path",
    [
        ("/Volumes/main/s/v/log", "/Volumes/main/s/v/log"),
        ("dbfs:/Volumes/main/s/v/log", "/Volumes/main/s/v/log"),
        ("file:///tmp/x/log", "/tmp/x/log"),
        ("file:/tmp/x/log", "/tmp/x/log"),
        ("relative/log", "relative/log"),
        ("~/log", "~/log"),
    ],
)
def test_local_paths_and_volumes_are_local_stores(uri: str, path: str) -> None:
    assert local_path(uri) == path
    parse_config(_config(recovery_log=uri, staging=uri), "pipeline.yaml")
    store = open_store(uri)
    assert isinstance(store, LocalStore)
    assert store.uri == str(Path(path).expanduser().absolute())


def test_s3_uris_are_accepted() -> None:
    parse_config(_config(recovery_log="s3://bucket/log", staging="s3a://bucket/staging"), "pipeline.yaml")

"""`[server]`, `[log]` and `[telemetry]`: bad values name the key and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from bot.config import parse_config
from core.errors import ConfigError


def _config(**sections: Any) -> dict[str, Any]:
    return {
        "default_provider": "p",
        "providers": {"p": {"kind": "openai_chat", "base_url": "http://x", "model": "m"}},
        **sections,
    }


def test_the_defaults_leave_everything_off() -> None:
    config = parse_config(_config())
    assert config.server.listen is None
    assert config.server.admin_token_env is None
    assert config.log.format == "text"
    assert config.telemetry.otlp_endpoint is None


@pytest.mark.parametrize("listen", ["9464", "localhost", ":9464", "host:port", "h:70000"])
def test_a_listen_address_that_is_not_host_port_names_the_key(listen: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(server={"listen": listen}))
    assert "server.listen" in str(caught.value)
    assert "HOST:PORT" in str(caught.value)


def test_an_ipv6_listen_address_is_taken_apart() -> None:
    config = parse_config(_config(server={"listen": "[::1]:9464"}))
    assert config.server.address() == ("::1", 9464)


def test_a_log_format_other_than_text_or_json_names_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(log={"format": "xml"}))
    assert "log.format" in str(caught.value)
    assert "json" in str(caught.value)

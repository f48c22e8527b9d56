from app.agent_env import agent_environment, is_allowed, parse_passthrough

RELAY_ENVIRON = {
    "HOME": "/home/relay",
    "PATH": "/usr/bin:/bin",
    "LANG": "en_US.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_CTYPE": "C.UTF-8",
    "ANTHROPIC_API_KEY": "sk-ant",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
    "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "200000",
    "CLAUDE_CONFIG_DIR": "/cfg",
    "https_proxy": "http://proxy:3128",
    "NODE_EXTRA_CA_CERTS": "/ca.pem",
    "OARLOCK_TOKEN": "secret-token",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "DEEPSEEK_API_KEY": "ds-secret",
    "RANDOM_VAR": "x",
    "GITHUB_TOKEN": "gh-secret",
}


def test_agent_environment_default_keeps_allowed_only() -> None:
    assert agent_environment(RELAY_ENVIRON) == {
        "HOME": "/home/relay",
        "PATH": "/usr/bin:/bin",
        "LANG": "en_US.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_CTYPE": "C.UTF-8",
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "200000",
        "CLAUDE_CONFIG_DIR": "/cfg",
        "https_proxy": "http://proxy:3128",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
    }


def test_agent_environment_default_drops_secrets() -> None:
    result = agent_environment(RELAY_ENVIRON)
    assert [name for name in ("OARLOCK_TOKEN", "AWS_SECRET_ACCESS_KEY") if name in result] == []


def test_agent_environment_default_drops_deepseek_key() -> None:
    assert "DEEPSEEK_API_KEY" not in agent_environment(RELAY_ENVIRON)


def test_agent_environment_default_drops_random_vars() -> None:
    assert agent_environment({"RANDOM_VAR": "x", "EDITOR": "vi", "PWD": "/"}) == {}


def test_agent_environment_keeps_lc_all() -> None:
    assert agent_environment({"LC_ALL": "C.UTF-8"}) == {"LC_ALL": "C.UTF-8"}


def test_agent_environment_passes_extra_names() -> None:
    assert agent_environment(RELAY_ENVIRON, ["DEEPSEEK_API_KEY", "RANDOM_VAR"]) == {
        "HOME": "/home/relay",
        "PATH": "/usr/bin:/bin",
        "LANG": "en_US.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_CTYPE": "C.UTF-8",
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "200000",
        "CLAUDE_CONFIG_DIR": "/cfg",
        "https_proxy": "http://proxy:3128",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
        "DEEPSEEK_API_KEY": "ds-secret",
        "RANDOM_VAR": "x",
    }


def test_agent_environment_extra_names_match_exactly() -> None:
    assert agent_environment({"DEEPSEEK_API_KEY": "k", "deepseek_api_key": "k"}, ["DEEPSEEK"]) == {}


def test_agent_environment_extra_names_accept_generator() -> None:
    extra = (name for name in ["RANDOM_VAR"])
    assert agent_environment({"RANDOM_VAR": "x", "OTHER": "y"}, extra) == {"RANDOM_VAR": "x"}


def test_agent_environment_names_are_case_sensitive() -> None:
    assert agent_environment({"home": "/h", "anthropic_api_key": "k", "lc_all": "C"}) == {}


def test_agent_environment_keeps_empty_values() -> None:
    assert agent_environment({"TZ": ""}) == {"TZ": ""}


def test_is_allowed_claude_prefix() -> None:
    assert is_allowed("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC") is True


def test_is_allowed_unknown_name() -> None:
    assert is_allowed("OARLOCK_TOKEN") is False


def test_parse_passthrough_commas_and_spaces() -> None:
    assert parse_passthrough("FOO, BAR BAZ") == ("FOO", "BAR", "BAZ")


def test_parse_passthrough_newlines_tabs_and_trailing_commas() -> None:
    assert parse_passthrough(" ,FOO,,\tBAR\nBAZ, ") == ("FOO", "BAR", "BAZ")


def test_parse_passthrough_drops_repeats() -> None:
    assert parse_passthrough("FOO BAR FOO") == ("FOO", "BAR")


def test_parse_passthrough_none() -> None:
    assert parse_passthrough(None) == ()


def test_parse_passthrough_empty() -> None:
    assert parse_passthrough("  ") == ()

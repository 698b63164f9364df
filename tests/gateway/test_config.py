"""Config loading: precedence, environment forms, and one clear message per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    """With nothing set, the documented defaults apply."""
    cfg = load(None, env={}, data_dir=tmp_path)
    assert (cfg.server.host, cfg.server.port, cfg.limits.max_batch) == ("127.0.0.1", 18789, 50)
    assert cfg.server.max_size == 4 * 1024 * 1024 and cfg.auth.mode == "token"
    assert cfg.memory.debounce_ms == 1500 and cfg.sessions.fsync == "batch"


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    """CLI flag > environment > file > default, key by key."""
    path = write(tmp_path,
                 "[server]\nport = 1111\nhost = '127.0.0.1'\n[memory]\ndebounce_ms = 10\n")
    env = {"RECALLD_SERVER_PORT": "2222", "RECALLD_MEMORY_DEBOUNCE_MS": "20"}
    assert load(path, env={}).server.port == 1111
    cfg = load(path, env=env)
    assert cfg.server.port == 2222 and cfg.memory.debounce_ms == 20
    assert load(path, env=env, overrides={"server": {"port": 3333}}).server.port == 3333


def test_well_known_variables(tmp_path: Path) -> None:
    """RECALLD_TOKEN, RECALLD_HOME, OPENAI_API_KEY and OPENAI_BASE_URL are honoured."""
    env = {
        "RECALLD_TOKEN": "t" * 20,
        "RECALLD_HOME": str(tmp_path / "home"),
        "OPENAI_API_KEY": "sk-x",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    }
    cfg = load(None, env=env)
    assert cfg.auth.token == "t" * 20 and cfg.data_dir == tmp_path / "home"
    assert cfg.llm.api_key == "sk-x" and cfg.llm.base_url == "http://127.0.0.1:9/v1"
    assert load(None, env={**env, "RECALLD_LLM_API_KEY": "sk-y"}).llm.api_key == "sk-y"


def test_env_values_are_parsed_by_type(tmp_path: Path) -> None:
    """Booleans, floats, lists and optional values parse from environment strings."""
    env = {
        "RECALLD_CHAT_RECALL": "false",
        "RECALLD_AUTH_TIMEOUT_S": "2.5",
        "RECALLD_SERVER_ALLOWED_ORIGINS": "https://a.example, https://b.example",
    }
    cfg = load(None, env=env, data_dir=tmp_path)
    assert cfg.chat.recall is False and cfg.auth.timeout_s == 2.5
    assert cfg.server.allowed_origins == ("https://a.example", "https://b.example")


def test_every_mistake_is_reported_with_its_origin(tmp_path: Path) -> None:
    """Unknown keys, unknown sections and bad values are listed together, each naming its place."""
    path = write(tmp_path,
                 "[server]\nprot = 1\nport = 'x'\n[nope]\na = 1\n[limits]\nmax_batch = 0\n")
    with pytest.raises(ConfigError) as info:
        load(path, env={"RECALLD_SESSIONS_FSYNC": "sometimes"})
    text = "\n".join(info.value.problems)
    assert "[server] prot: unknown key" in text
    assert "[server] port: must be an integer" in text
    assert "unknown section [nope]" in text
    assert "[limits] max_batch: must be >= 1" in text
    assert "RECALLD_SESSIONS_FSYNC: must be one of always, batch, never" in text
    assert len(info.value.problems) == 5


def test_retrieval_keys_load_and_bad_ones_are_named(tmp_path: Path) -> None:
    """The round-2 [memory] retrieval keys load from the file; a bad fusion or weight is
    refused by name."""
    good = write(tmp_path, "[memory]\nfusion = 'rrf'\nkeyword_weight = 0.3\nchunk_tokens = 300\n"
                           "recall_min_similarity = 0.45\nrerank = true\n"
                           "local_model = 'bge-small-en-v1.5'\n")
    memory = load(good, env={}).memory
    assert (memory.fusion, memory.keyword_weight, memory.chunk_tokens) == ("rrf", 0.3, 300)
    assert ((memory.recall_min_similarity, memory.rerank, memory.local_model)
            == (0.45, True, "bge-small-en-v1.5"))
    bad = write(tmp_path, "[memory]\nfusion = 'max'\nkeyword_weight = 2\n")
    with pytest.raises(ConfigError) as info:
        load(bad, env={})
    text = "\n".join(info.value.problems)
    assert ("[memory] fusion: must be one of convex, rrf" in text
            and "keyword_weight must be between 0 and 1" in text)


def test_invalid_toml_is_one_clear_message(tmp_path: Path) -> None:
    """A file that is not TOML is reported with its path."""
    path = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(path, env={})


def test_auth_none_refused_off_loopback(tmp_path: Path) -> None:
    """auth.mode = "none" on a non-loopback bind is refused, saying why and how to fix it."""
    with pytest.raises(ConfigError) as info:
        load(None, env={}, data_dir=tmp_path,
             overrides={"server": {"host": "0.0.0.0"}, "auth": {"mode": "none"}})
    assert "127.0.0.1" in info.value.problems[0] and "token" in info.value.problems[0]
    assert load(None, env={}, data_dir=tmp_path,
                overrides={"auth": {"mode": "none"}}).auth.mode == "none"


def test_auth_users_tables(tmp_path: Path) -> None:
    """[[auth.users]] entries become (name, token) pairs; malformed entries are refused."""
    path = write(tmp_path, '[[auth.users]]\nname = "alice"\ntoken = "aaaaaaaaaaaaaaaaaaaa"\n')
    assert load(path, env={}).auth.users[0].name == "alice"
    bad = write(tmp_path, '[[auth.users]]\nname = "alice"\n')
    with pytest.raises(ConfigError, match="users"):
        load(bad, env={})


def test_example_config_is_valid_and_complete(tmp_path: Path) -> None:
    """config.example.toml loads cleanly and names every key of every section."""
    import dataclasses
    import tomllib

    from gateway.config import _SECTIONS

    example = Path(__file__).parents[2] / "config.example.toml"
    load(example, env={})
    text = example.read_text()
    for name, cls in _SECTIONS.items():
        assert f"[{name}]" in text, name
        for f in dataclasses.fields(cls):
            assert f"{f.name} =" in text, f"{name}.{f.name} missing from config.example.toml"
    assert tomllib.loads(text)

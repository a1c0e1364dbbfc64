"""The run's LLM upstreams (ale/runner/gateway_proc.py): ``--llm-upstream`` and the usual environment,
checked as the gateway checks them, the key never in a message, a repr or the harness's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ale.runner import gateway_proc
from ale.runner.gateway_proc import Upstream, UpstreamError, configure, parse_flag, routes

KEY = "sk-test-9c1d0e5fb27a4f3a8d6e"


def test_a_flag_names_its_upstream_api_and_key_variable() -> None:
    env = {"OPENAI_API_KEY": KEY, "LOCAL_API_KEY": "sk-local", "MY_KEY": "sk-mine"}
    openai = parse_flag("openai=https://api.openai.com/v1", env)
    assert (openai.name, openai.api, openai.base_url, openai.api_key) == (
        "openai", "openai", "https://api.openai.com/v1", KEY,
    )  # fmt: skip
    local = parse_flag("local=http://127.0.0.1:8080/v1,api=openai", env)
    assert (local.api, local.api_key, local.key_var) == ("openai", "sk-local", "LOCAL_API_KEY")
    mine = parse_flag("claude-eu=https://eu.example.org,api=anthropic,key-env=MY_KEY,ca-file=/etc/ca.pem", env)
    assert (mine.api, mine.api_key, mine.ca_file) == ("anthropic", "sk-mine", "/etc/ca.pem")
    assert parse_flag("llama=http://127.0.0.1:9/v1,api=openai", {}).api_key is None  # a local server needs none


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("openai", "expected NAME=URL"),
        ("=https://x", "expected NAME=URL"),
        ("local=http://127.0.0.1/v1", "say which API it speaks"),
        ("local=http://127.0.0.1/v1,api=cohere", "say which API it speaks"),
        ("openai=https://x,speed=fast", "'speed' is not one of api=, key-env=, ca-file="),
        ("openai=https://x,api=openai,api=openai", "(once each)"),
        ("openai=https://x,key-env=NOT A VAR", "is not an environment variable's name"),
    ],
)
def test_a_malformed_flag_says_what_is_wrong(flag: str, message: str) -> None:
    with pytest.raises(UpstreamError, match=__import__("re").escape(message)):
        parse_flag(flag, {})


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("openai=http://api.openai.com/v1", "plain http only to a loopback host"),
        ("openai=ftp://api.openai.com/v1", "must be an http(s) URL"),
        ("openai=https://user:pw@api.openai.com/v1", "no credentials, query or fragment"),
        ("openai=https://api.openai.com/v1?x=1", "no credentials, query or fragment"),
        ("Open_AI=https://api.openai.com/v1,api=openai", "must match [a-z0-9-]{1,32}"),
    ],
)
def test_the_gateways_own_refusals_come_before_the_run(flag: str, message: str) -> None:
    """The gateway's configuration parser decides; the flag (never the key) is named."""
    with pytest.raises(UpstreamError) as info:
        configure([flag], {"OPENAI_API_KEY": KEY, "OPEN_AI_API_KEY": KEY})
    assert message in str(info.value)
    assert "--llm-upstream" in str(info.value)
    assert KEY not in str(info.value)


def test_the_usual_environment_makes_upstreams_unless_told_not_to() -> None:
    env = {"OPENAI_API_KEY": KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:4000"}
    found = configure([], env)
    assert [(u.name, u.api, u.base_url, u.api_key) for u in found] == [
        ("openai", "openai", "https://api.openai.com/v1", KEY),
        ("anthropic", "anthropic", "http://127.0.0.1:4000", None),
    ]
    assert configure([], env, use_environment=False) == ()
    assert configure([], {}) == ()
    # A flag of the same name wins over the environment's.
    (flagged, env_anthropic) = configure(["openai=http://127.0.0.1:5/v1"], env)
    assert (flagged.base_url, flagged.api_key) == ("http://127.0.0.1:5/v1", KEY)
    assert env_anthropic.name == "anthropic"


def test_two_upstreams_of_one_name_are_refused() -> None:
    with pytest.raises(UpstreamError, match="same name"):
        configure(["openai=https://a.example/v1", "openai=https://b.example/v1"], {})


def test_the_key_is_in_no_repr_and_leaves_the_environment() -> None:
    upstream = parse_flag("openai=https://api.openai.com/v1", {"OPENAI_API_KEY": KEY})
    assert KEY not in repr(upstream)
    assert KEY not in repr(gateway_proc.GatewaySpec("r", (upstream,), {}, *(gateway_proc.Path("/x"),) * 3))
    env = {"OPENAI_API_KEY": KEY, "PATH": "/bin"}
    gateway_proc.forget_keys([upstream], env)
    assert env == {"PATH": "/bin"}


def test_the_sandbox_routes_each_api_to_its_upstream() -> None:
    def up(name: str, api: str) -> Upstream:
        return Upstream(name=name, api=api, base_url="https://x", api_key=None)

    assert routes([up("local", "openai"), up("openai", "openai"), up("claude", "anthropic")]) == {
        "openai": "openai",
        "anthropic": "claude",
    }
    assert routes([up("b", "openai"), up("a", "openai")]) == {"openai": "b"}  # the first given


def test_the_gateway_process_gets_no_key_in_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("SOMETHING_ELSE", KEY)
    monkeypatch.setenv("ANY_API_KEY", "sk-other")
    upstream = parse_flag("openai=https://api.openai.com/v1", {"OPENAI_API_KEY": KEY})
    env = gateway_proc._environment([upstream])
    assert KEY not in env.values()
    assert "ANY_API_KEY" not in env
    assert "PATH" in env


def test_gateway_argv_holds_paths_and_a_descriptor_only() -> None:
    upstream = parse_flag("openai=https://api.openai.com/v1", {"OPENAI_API_KEY": KEY})
    spec = gateway_proc.GatewaySpec(
        "run-1",
        (upstream,),
        {},
        gateway_proc.Path("/r/a.sock"),
        gateway_proc.Path("/r/c.sock"),
        gateway_proc.Path("/r/e"),
    )
    argv = gateway_proc.gateway_argv(spec, 7)
    assert argv[1:] == [
        "-m", "ale.gateway", "serve", "--agent-socket", "/r/a.sock", "--control-socket", "/r/c.sock",
        "--config-fd", "7", "--events", "/r/e",
    ]  # fmt: skip
    assert spec.placeholder not in " ".join(argv)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llm-upstream", "nonsense"], "--llm-upstream 'nonsense': expected NAME=URL"),
        (["--llm-upstream", "openai=http://example.com/v1"], "plain http only to a loopback host"),
    ],
)
def test_ale_run_with_a_bad_upstream_is_one_line_before_anything_starts(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--no-llm-environment", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": KEY},
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("ale: error: ")
    assert message in done.stderr
    assert done.stderr.count("\n") == 1
    assert KEY not in done.stderr
    assert list(tmp_path.iterdir()) == []  # not even the output folder

"""The LLM agent's pieces without a model: its tools against hostile calls, the context budget,
the completion and error parsers (with fuzz targets), the command line and its registration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale.agents import llm, llm_client, llm_prompt, llm_tools
from ale.agents.llm_tools import Tools
from ale.core.parse import ParseError
from ale.policy import linear_policy
from ale.runner import cli


@pytest.fixture
def spaces(tmp_path: Path) -> tuple[Path, Path]:
    workspace, task = tmp_path / "workspace", tmp_path / "task"
    workspace.mkdir()
    task.mkdir()
    (task / "paper.md").write_text("# The paper\nline 2\n")
    return workspace, task


@pytest.fixture
def tools(spaces: tuple[Path, Path]) -> Tools:
    workspace, task = spaces
    return Tools(
        workspace=workspace,
        readable=(task,),
        output_limit=4000,
        env={"PATH": os.environ["PATH"]},
        required=workspace / "policy.safetensors",
    )


def call(tools: Tools, name: str, args: object) -> llm_tools.ToolResult:
    return tools.call(name, args if isinstance(args, str) else json.dumps(args))


# -- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"path": "a.txt", "content": "x"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"a string"', "must be a JSON object, not str"),
        ('{"path": "a", "path": "b", "content": ""}', "not valid JSON"),
        ('{"path": "a.txt", "content": 5}', "'content' must be a string, not int"),
        ('{"path": "a.txt", "content": "x", "executable": 1}', "'executable' must be true or false"),
        ('{"path": "a.txt", "content": "x", "mode": "0777"}', "takes no argument 'mode'"),
        ('{"content": "x"}', "needs the argument 'path'"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 8"),
        ('{"path": "a.txt", "content": "' + "x" * (9 << 20) + '"}', "exceeds the limit"),
    ],
)
def test_malformed_or_hostile_write_arguments_are_a_clear_tool_error_and_write_nothing(
    tools: Tools, spaces: tuple[Path, Path], raw: str, says: str
) -> None:
    result = call(tools, "write_file", raw)
    assert result.error
    assert result.text.startswith("error: ")
    assert says in result.text
    assert len(result.text) < 1000
    assert list(spaces[0].iterdir()) == []


def test_a_tool_that_does_not_exist_names_the_real_ones(tools: Tools) -> None:
    result = call(tools, "rm_rf" * 100, {})
    assert result.error
    assert "there is no tool" in result.text
    assert "run_shell" in result.text
    assert len(result.text) < 400


def test_a_number_argument_refuses_true_and_accepts_an_integer(tools: Tools) -> None:
    assert "'timeout_s' must be a number" in call(tools, "run_shell", {"command": "true", "timeout_s": True}).text
    assert not call(tools, "run_shell", {"command": "true", "timeout_s": 5}).error


def test_empty_arguments_mean_none(tools: Tools) -> None:
    assert not call(tools, "list_files", "").error
    assert "needs the argument 'path'" in call(tools, "read_file", "").text


# -- paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/etc/passwd", "../task/../../etc/hostname", "/", "sub/../../outside.txt"])
def test_reading_outside_the_workspace_and_the_task_is_refused(tools: Tools, path: str) -> None:
    result = call(tools, "read_file", {"path": path})
    assert result.error
    assert "is outside" in result.text
    assert "only files there can be read" in result.text


def test_a_symlink_out_of_the_workspace_is_refused_for_reading_and_writing(
    tools: Tools, spaces: tuple[Path, Path], tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-MARKER")
    (spaces[0] / "link").symlink_to(secret)
    (spaces[0] / "dirlink").symlink_to(tmp_path)
    assert "outside" in call(tools, "read_file", {"path": "link"}).text
    assert "outside" in call(tools, "write_file", {"path": "link", "content": "x"}).text
    assert "outside" in call(tools, "write_file", {"path": "dirlink/new.txt", "content": "x"}).text
    assert "outside" in call(tools, "list_files", {"path": "dirlink"}).text
    assert secret.read_text() == "SECRET-MARKER"
    assert not (tmp_path / "new.txt").exists()


def test_the_task_folder_is_readable_but_not_writable(tools: Tools, spaces: tuple[Path, Path]) -> None:
    paper = spaces[1] / "paper.md"
    assert call(tools, "read_file", {"path": str(paper)}).text.startswith("# The paper\nline 2\n")
    result = call(tools, "write_file", {"path": str(paper), "content": "overwritten"})
    assert result.error
    assert "only files there can be written" in result.text
    assert paper.read_text().startswith("# The paper")


@pytest.mark.parametrize("path", ["", "a\x00b", "x" * 5000])
def test_empty_nul_and_overlong_paths_are_refused(tools: Tools, path: str) -> None:
    result = call(tools, "read_file", {"path": path})
    assert result.error
    assert "non-empty string without NUL" in result.text


def test_write_makes_parent_folders_and_sets_the_executable_bit(tools: Tools, spaces: tuple[Path, Path]) -> None:
    result = call(tools, "write_file", {"path": "a/b/policy", "content": "#!/bin/sh\necho hi\n", "executable": True})
    assert not result.error, result.text
    target = spaces[0] / "a" / "b" / "policy"
    assert target.read_text() == "#!/bin/sh\necho hi\n"
    assert os.access(target, os.X_OK)
    assert [p.name for p in target.parent.iterdir()] == ["policy"]  # no temporary file left


def test_writing_onto_a_folder_is_refused(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "d").mkdir()
    assert "is a folder" in call(tools, "write_file", {"path": "d", "content": "x"}).text
    assert "is a folder" in call(tools, "write_file", {"path": ".", "content": "x"}).text


# -- reading and listing --------------------------------------------------------------------------


def test_reading_a_huge_file_is_cut_with_where_to_read_on(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 200_001)))
    result = call(tools, "read_file", {"path": "big.txt"})
    assert not result.error
    assert len(result.text) <= tools.output_limit
    assert result.text.startswith("line 1\nline 2\n")
    assert "read on with offset=" in result.text
    offset = int(result.text.rsplit("offset=", 1)[1].split("]")[0])
    more = call(tools, "read_file", {"path": "big.txt", "offset": offset, "limit": 2})
    assert more.text.startswith(f"line {offset}\nline {offset + 1}\n")


def test_reading_one_enormous_line_is_cut_inside_it(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "one.txt").write_text("y" * 1_000_000)
    result = call(tools, "read_file", {"path": "one.txt"})
    assert len(result.text) <= tools.output_limit
    assert "cut at the output limit inside line 1" in result.text


def test_reading_a_binary_file_says_how_to_inspect_it(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "policy.safetensors").write_bytes(linear_policy(np.zeros((2, 4)), output="discrete"))
    result = call(tools, "read_file", {"path": "policy.safetensors"})
    assert result.error
    assert "binary file" in result.text


def test_reading_past_the_end_and_bad_ranges(tools: Tools, spaces: tuple[Path, Path]) -> None:
    assert "nothing from line 99" in call(tools, "read_file", {"path": str(spaces[1] / "paper.md"), "offset": 99}).text
    assert "at least 1" in call(tools, "read_file", {"path": str(spaces[1] / "paper.md"), "offset": 0}).text
    assert "is a folder" in call(tools, "read_file", {"path": "."}).text
    assert "there is no file 'missing.txt'" in call(tools, "read_file", {"path": "missing.txt"}).text


def test_listing_a_huge_folder_is_capped(tools: Tools, spaces: tuple[Path, Path]) -> None:
    for i in range(1000):
        (spaces[0] / f"f{i:04d}").write_text("")
    result = call(tools, "list_files", {"depth": 99})
    assert not result.error
    assert result.text.count("\n") <= llm_tools.MAX_LIST_ENTRIES + 2
    assert f"{1000 - llm_tools.MAX_LIST_ENTRIES} more entries not listed" in result.text


def test_listing_shows_sizes_folders_and_executables(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "sub").mkdir()
    (spaces[0] / "sub" / "x.py").write_text("print(1)\n")
    (spaces[0] / "run.sh").write_text("")
    (spaces[0] / "run.sh").chmod(0o755)
    text = call(tools, "list_files", {}).text
    assert "run.sh* (0 bytes)" in text
    assert "sub/" in text
    assert "sub/x.py (9 bytes)" in text


# -- the shell ------------------------------------------------------------------------------------


def test_shell_runs_in_the_workspace_and_reports_the_exit_status(tools: Tools, spaces: tuple[Path, Path]) -> None:
    result = call(tools, "run_shell", {"command": "pwd; echo oops >&2; exit 3"})
    assert result.error
    assert result.text.startswith("exit status 3 in ")
    assert str(spaces[0]) in result.text
    assert "oops" in result.text
    assert result.shell == ("pwd; echo oops >&2; exit 3", 3)


def test_shell_output_of_50_mb_is_cut_to_its_head_and_tail(tools: Tools) -> None:
    result = call(
        tools, "run_shell", {"command": "echo FIRST; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo LAST"}
    )
    assert not result.error
    assert len(result.text) <= tools.output_limit
    assert "FIRST" in result.text
    assert "LAST" in result.text
    assert "bytes of output cut" in result.text


def test_shell_timeout_kills_the_command_and_what_it_started(tools: Tools, spaces: tuple[Path, Path]) -> None:
    command = "sleep 300 & echo $! > child.pid; echo started; sleep 300"
    started = time.monotonic()
    result = call(tools, "run_shell", {"command": command, "timeout_s": 1})
    assert time.monotonic() - started < 10
    assert result.error
    assert result.text.startswith("killed after 1 s (timeout)")
    assert "started" in result.text
    assert result.shell == (command, None)
    child = int((spaces[0] / "child.pid").read_text())
    for _ in range(100):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the command's child {child} survived the timeout")


def test_shell_returns_when_the_command_ends_although_a_background_job_keeps_the_output_open(tools: Tools) -> None:
    started = time.monotonic()
    result = call(tools, "run_shell", {"command": "sleep 30 & echo done", "timeout_s": 20})
    assert time.monotonic() - started < 5
    assert not result.error
    assert "done" in result.text


def test_shell_timeout_is_capped_by_the_limit_and_the_wall_time_left(spaces: tuple[Path, Path]) -> None:
    tools = Tools(workspace=spaces[0], max_timeout_s=60, time_left=lambda: 2.0, env={"PATH": os.environ["PATH"]})
    result = call(tools, "run_shell", {"command": "sleep 10", "timeout_s": 1e308})
    assert "killed after 2 s" in result.text
    assert "wall time left" in result.text
    none_left = Tools(workspace=spaces[0], time_left=lambda: 0.5)
    assert "no wall time is left" in call(none_left, "run_shell", {"command": "true"}).text


@pytest.mark.parametrize("timeout", [0, -5, "NaN"])
def test_shell_timeout_must_be_positive(tools: Tools, timeout: object) -> None:
    raw = '{"command": "true", "timeout_s": %s}' % timeout  # noqa: UP031 - NaN is not JSON: a parse error
    result = call(tools, "run_shell", raw)
    assert result.error
    assert "positive number" in result.text or "not valid JSON" in result.text


def test_shell_does_not_pass_the_event_channel_on(spaces: tuple[Path, Path]) -> None:
    env = {"PATH": os.environ["PATH"], "ALE_EVENT_FD": "7", "ALE_TASK_ID": "t"}
    agent = llm.build_agent(
        llm.Settings(model="m", base_url="http://127.0.0.1:9/v1"),
        {**env, "ALE_WORKSPACE": str(spaces[0]), "ALE_TASK_DIR": str(spaces[1])},
    )
    text = call(agent.tools, "run_shell", {"command": "echo fd=${ALE_EVENT_FD:-none} task=$ALE_TASK_ID"}).text
    assert "fd=none task=t" in text


# -- finish ---------------------------------------------------------------------------------------


def test_finish_without_the_policy_is_refused_once_then_ends(tools: Tools) -> None:
    first = call(tools, "finish", {"summary": "done"})
    assert first.error
    assert not first.finish
    assert "there is no" in first.text
    second = call(tools, "finish", {})
    assert second.finish
    assert "although there is no" in second.text


def test_finish_checks_that_the_artifact_is_one(tools: Tools, spaces: tuple[Path, Path]) -> None:
    (spaces[0] / "policy.safetensors").write_bytes(b"not safetensors")
    assert "not a valid policy artifact" in call(tools, "finish", {}).text
    (spaces[0] / "policy.safetensors").write_bytes(linear_policy(np.zeros((2, 4)), output="discrete"))
    result = call(tools, "finish", {})
    assert result.finish
    assert result.text == "finished"


def test_finish_on_an_interactive_task_needs_an_executable_policy(spaces: tuple[Path, Path]) -> None:
    tools = Tools(workspace=spaces[0], required=spaces[0] / "policy", required_executable=True)
    (spaces[0] / "policy").write_text("#!/bin/sh\n")
    assert "is not executable" in call(tools, "finish", {}).text
    (spaces[0] / "policy").chmod(0o755)
    assert tools.policy_problem() is None


# -- the context budget ---------------------------------------------------------------------------


def _turn(conv: llm.Conversation, i: int, output: str, argument: str = "") -> None:
    call_id = f"call_{i}"
    arguments = json.dumps({"path": f"f{i}.py", "content": argument}) if argument else "{}"
    conv.start_turn(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "x", "arguments": arguments}}],
        }
    )
    conv.add({"role": "tool", "tool_call_id": call_id, "content": output})


def _well_formed(messages: list[dict]) -> None:
    """Every tool message answers a call of the assistant message before it."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls") or ()}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_calls
            open_calls.discard(m["tool_call_id"])


def test_a_long_session_stays_under_the_context_budget_and_keeps_the_head(tmp_path: Path) -> None:
    conv = llm.Conversation("SYSTEM " * 100, "FIRST", context_tokens=20_000)
    budget = conv.budget()
    for i in range(300):
        _turn(conv, i, f"output {i} " + "z" * 3000, argument="c" * 5000 if i % 3 == 0 else "")
        messages = conv.messages()
        assert sum(llm._size(m) for m in messages) <= budget + 200
        assert messages[0]["content"].startswith("SYSTEM")
        assert messages[1]["content"] == "FIRST"
        _well_formed(messages)
    assert conv.dropped > 0
    assert conv.elided > 0
    assert "earlier turns were removed" in messages[2]["content"]
    assert messages[-1]["content"].startswith("output 299 zzz")
    assert len(messages[-1]["content"]) > 3000


def test_old_outputs_are_elided_before_any_turn_is_dropped() -> None:
    conv = llm.Conversation("S", "F", context_tokens=10_000)  # 22,500 characters
    for i in range(10):
        _turn(conv, i, "o" * 2000, argument="a" * 1000)
    messages = conv.messages()
    assert conv.dropped == 0
    assert conv.elided > 0
    old_tool = messages[3]
    assert "[elided:" in old_tool["content"]
    old_args = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])
    assert old_args["path"] == "f0.py"
    assert "characters elided to save context" in old_args["content"]
    assert messages[-1]["content"] == "o" * 2000  # the newest output is whole


def test_a_context_overflow_squeezes_the_budget() -> None:
    conv = llm.Conversation("S", "F", context_tokens=10_000)
    before = conv.budget()
    conv.overflowed()
    assert conv.budget() < before


def test_reported_prompt_tokens_calibrate_the_budget() -> None:
    conv = llm.Conversation("S", "F", context_tokens=1000)
    conv.observe(sent_chars=8000, input_tokens=1000)
    assert conv.chars_per_token == 8.0
    conv.observe(sent_chars=1000, input_tokens=1000)
    assert conv.chars_per_token == 1.0
    conv.observe(sent_chars=1000, input_tokens=0)  # an endpoint that reports no usage changes nothing
    assert conv.chars_per_token == 1.0


# -- the parsers ----------------------------------------------------------------------------------


def test_a_completion_with_odd_but_valid_shapes_is_read() -> None:
    body = {
        "model": "served-name",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "reasoning_content": "HIDDEN-REASONING",
                    "tool_calls": [{"function": {"name": "list_files", "arguments": {"path": "."}}}, "junk"],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}},
    }
    completion = llm_client.parse_completion(json.dumps(body).encode())
    assert completion.content == "ab"
    assert completion.model == "served-name"
    assert completion.usage == llm_client.Usage(10, 2, 4)
    (tool_call,) = completion.tool_calls
    assert tool_call.name == "list_files"
    assert json.loads(tool_call.arguments) == {"path": "."}
    assert tool_call.id.startswith("call_0_")
    assert "HIDDEN-REASONING" not in json.dumps(completion.message())


@pytest.mark.parametrize(
    "body", [b"", b"[]", b'{"choices": []}', b'{"choices": [1]}', b'{"choices": [{"message": "x"}]}', b"\xff"]
)
def test_a_body_that_is_no_completion_is_a_parse_error(body: bytes) -> None:
    with pytest.raises(ParseError):
        llm_client.parse_completion(body)


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_completion_parser(raw: bytes) -> None:
    try:
        completion = llm_client.parse_completion(raw)
    except ParseError:
        return
    assert isinstance(completion.content, str)
    completion.message()


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.sampled_from(sorted(llm_tools._SCHEMAS)),
    st.one_of(
        hostile_json.map(lambda b: b.decode("utf-8", "replace")),
        json_values.map(json.dumps),
        st.dictionaries(st.sampled_from(["path", "content", "command", "depth", "x"]), json_values).map(json.dumps),
    ),
)
def test_fuzz_tool_arguments_parser(name: str, raw: str) -> None:
    try:
        args = llm_tools.parse_arguments(name, raw)
    except llm_tools.ToolError as exc:
        message = str(exc)
        assert message, "a refusal always says why"
        return
    assert isinstance(args, dict)
    assert set(args) <= set(llm_tools._SCHEMAS[name])


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_error_body_reader(raw: bytes) -> None:
    message, words = llm_client._error_text(raw)
    assert isinstance(message, str)
    assert isinstance(words, str)
    assert len(message) <= llm_client.MAX_ERROR_CHARS + 40


def test_retry_after_in_seconds_milliseconds_and_dates_is_capped() -> None:
    import email.message
    import email.utils

    def headers(**values: str) -> email.message.Message:
        m = email.message.Message()
        for k, v in values.items():
            m[k.replace("_", "-")] = v
        return m

    assert llm_client._retry_after(headers(retry_after="2"), 60) == 2.0
    assert llm_client._retry_after(headers(retry_after_ms="1500"), 60) == 1.5
    assert llm_client._retry_after(headers(retry_after="99999"), 60) == 60
    assert llm_client._retry_after(headers(retry_after="soon"), 60) is None
    future = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3 <= (llm_client._retry_after(headers(retry_after=future), 60) or 0) <= 5
    assert llm_client._retry_after(headers(), 60) is None


@pytest.mark.parametrize("url", ["ftp://x/v1", "http:///v1", "http://h:99999/v1", "http://h/v1?q=1", "unix:/sock"])
def test_a_base_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="base URL"):
        llm_client.Endpoint.parse(url)


def test_base_urls_keep_their_path() -> None:
    assert llm_client.Endpoint.parse("http://127.0.0.1:27100/openai/").url("chat/completions") == (
        "http://127.0.0.1:27100/openai/chat/completions"
    )
    assert llm_client.Endpoint.parse("https://api.openai.com/v1").port == 443


# -- the prompt, the command line, the registration -----------------------------------------------


def test_the_system_prompt_has_the_contract_the_mode_and_the_paper(spaces: tuple[Path, Path]) -> None:
    workspace, task = spaces
    (task / "task.json").write_text(json.dumps({"id": "t", "mode": "interactive", "official_episodes": 7}))
    env = {"ALE_WORKSPACE": str(workspace), "ALE_TASK_DIR": str(task), "ALE_BUDGET_WALL_TIME_S": "600"}
    info = llm.task_info(env)
    prompt = llm_prompt.system_prompt(info)
    assert info.mode == "interactive"
    assert info.task_id == "t"
    for needle in (
        "# The paper\nline 2",
        f"{workspace}/policy",
        f"#!{sys.executable}",
        "run_policy",
        "ALE_EVALUATOR",
        "RemoteVectorEnv",
        "600 s of wall time",
        "on 7 episodes",
        "No network",
    ):
        assert needle in prompt, needle
    assert "policy.safetensors" not in prompt
    batch = llm_prompt.system_prompt(llm.task_info({**env, "ALE_MODE": "batch"}))
    assert "policy.safetensors" in batch
    assert "submit_batch_eval" in batch
    assert "linear_policy" in batch


def test_a_huge_paper_is_cut_with_a_pointer_to_the_file(spaces: tuple[Path, Path]) -> None:
    (spaces[1] / "paper.md").write_text("p" * 200_000)
    prompt = llm_prompt.system_prompt(llm.task_info({"ALE_TASK_DIR": str(spaces[1])}))
    assert len(prompt) < llm_prompt.MAX_PAPER_CHARS + 20_000
    assert "the paper goes on: read" in prompt


def test_the_agent_without_a_model_or_endpoint_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "ALE_LLM_MODEL")}
    env["ALE_WORKSPACE"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-m", "ale.agents.llm"], env=env, capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "no model: give --model" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "ale.agents.llm", "--model", "m"], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode != 0
    assert "OPENAI_BASE_URL is not set" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "ale.agents.llm", "--model", "m", "--base-url", "ftp://x"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert "is not an http:// or https:// URL" in run.stderr


def test_ale_run_agent_llm_passes_the_model_and_needs_one() -> None:
    parser = cli.build_parser()
    spec = cli._agent(parser.parse_args(["run", "cartpole-balance", "--agent", "llm", "--model", "gpt-x"]))
    assert spec.name == "ale-llm"
    assert spec.command[-4:] == ("-m", "ale.agents.llm", "--model", "gpt-x")
    assert spec.modules == ("ale.agents.llm",)
    assert spec.declared["model"] == "gpt-x"
    with pytest.raises(cli.CliError, match="--agent llm needs --model"):
        cli._agent(parser.parse_args(["run", "cartpole-balance", "--agent", "llm"]))


def test_the_llm_agents_environment_holds_its_modules_and_no_http_sdk() -> None:
    from ale.runner import agent_env

    modules, external = agent_env.ale_closure(["ale.agents.llm"])
    assert {"ale.agents.llm_client", "ale.agents.llm_tools", "ale.agents.llm_prompt", "ale.policy"} <= set(modules)
    assert not {name.split(".")[0] for name in external} & {"openai", "httpx", "requests", "anthropic"}


@pytest.mark.parametrize(
    ("status", "advice", "raised"),
    [
        (500, "", "_Retry"),
        (500, "false", "_Retry"),  # the gateway's 502/504 say false: the upstream may answer next time
        (429, "false", "UpstreamFailed"),
        (408, "false", "UpstreamFailed"),
        (400, "true", "_Retry"),
        (429, "", "_Retry"),
        (404, "", "UpstreamFailed"),
    ],
)
def test_x_should_retry_overrides_the_status_except_false_on_a_5xx(status: int, advice: str, raised: str) -> None:
    import email.message

    headers = email.message.Message()
    if advice:
        headers["x-should-retry"] = advice
    client = llm_client.ChatClient(base_url="http://127.0.0.1:9/v1", api_key="", model="m")
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the class is the parameter
        client._refusal(status, headers, b'{"error": {"message": "no"}}')  # type: ignore[arg-type]
    assert type(caught.value).__name__ == raised

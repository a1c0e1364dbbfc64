"""The agent of the gateway run tests (tests/test_gateway_run.py): run inside the real sandbox with the
official ``openai`` and ``anthropic`` SDKs (``ale run --agent-package``), it exercises the gateway
as an agent would and prints one ``REPORT {json}`` line; it leaves an interactive policy that
probes the official phase's network and prints ``POLICY {json}``.

Its requests, in order (the test's upstream scripts the turns of those that reach it):
1. chat, plain (its answer is the policy's gain); 2. chat, streaming; 3. Anthropic messages, plain;
4. Anthropic messages, streaming; 5. a slow chat stream it drops after two chunks. Denied on the
way: a path off the allow-list, an unknown upstream, a wrong key.
"""

from __future__ import annotations

POLICY = r"""#!/ale/python/bin/python3
import json, os, socket
probe = {"socket_exists": os.path.exists("/ale/gateway.sock"),
         "env": sorted(k for k in os.environ if "GATEWAY" in k or k.endswith(("_BASE_URL", "_API_KEY")))}
try:
    socket.create_connection(("127.0.0.1", 27100), timeout=3).close()
    probe["relay"] = "connected"
except OSError as exc:
    probe["relay"] = type(exc).__name__
print("POLICY " + json.dumps(probe), flush=True)
from ale.client import run_policy
GAIN = __GAIN__
run_policy(lambda obs: [max(-3.0, min(3.0, GAIN * float(obs[1])))])
"""

AGENT = r"""
import json, os, socket, time
import urllib.error, urllib.request
import anthropic, openai
r = {"env": {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY",
     "ANTHROPIC_API_KEY", "ALE_GATEWAY_URL", "ALE_GATEWAY_SOCKET", "ALE_GATEWAY_UPSTREAMS")}}
oa = openai.OpenAI(max_retries=0)
plain = oa.chat.completions.create(model="m-plain", messages=[{"role": "user", "content": "the gain?"}])
r["chat"] = plain.choices[0].message.content
r["chat_usage"] = [plain.usage.prompt_tokens, plain.usage.completion_tokens]
stream = oa.chat.completions.create(model="m-stream", messages=[{"role": "user", "content": "stream"}], stream=True)
r["chat_stream"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
an = anthropic.Anthropic(max_retries=0)
msg = an.messages.create(model="claude-plain", max_tokens=200, messages=[{"role": "user", "content": "hi"}])
r["messages"] = msg.content[0].text
with an.messages.stream(model="claude-stream", max_tokens=200, messages=[{"role": "user", "content": "go"}]) as s:
    r["messages_stream"] = "".join(s.text_stream)
denied = {}
base = os.environ["ALE_GATEWAY_URL"]
key = os.environ["OPENAI_API_KEY"]
for name, (method, url, token) in {
    "path": ("GET", os.environ["OPENAI_BASE_URL"] + "/files", key),
    "upstream": ("POST", base + "/nosuch/v1/chat/completions", key),
    "key": ("POST", os.environ["OPENAI_BASE_URL"] + "/chat/completions", "sk-not-the-placeholder"),
}.items():
    body = None if method == "GET" else b'{"model": "x"}'
    request = urllib.request.Request(url, data=body, method=method, headers={
        "authorization": "Bearer " + token, "content-type": "application/json"})
    try:
        denied[name] = urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as exc:
        denied[name] = exc.code
r["denied"] = denied
# a slow stream, dropped after two chunks
dropped = oa.chat.completions.create(model="m-drop", messages=[{"role": "user", "content": "slow"}], stream=True)
seen = 0
for chunk in dropped:
    seen += 1
    if seen == 2:
        break
dropped.close()
r["dropped_after"] = seen
out = {}
for name, addr in [("public", ("1.1.1.1", 443)), ("upstream_host_port", ("127.0.0.1", __UPSTREAM_PORT__))]:
    try:
        socket.create_connection(addr, timeout=3).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
r["direct"] = out
gain = json.loads(r["chat"])["gain"]
with open("/workspace/policy", "w") as fh:
    fh.write(__POLICY__.replace("__GAIN__", repr(gain)))
os.chmod("/workspace/policy", 0o755)
time.sleep(0.5)
print("REPORT " + json.dumps(r), flush=True)
"""


def agent_code(upstream_port: int) -> str:
    return AGENT.replace("__UPSTREAM_PORT__", str(upstream_port)).replace("__POLICY__", repr(POLICY))

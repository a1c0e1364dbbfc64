"""The LLM gateway: the sandbox's only way out (producer ``trusted_network_proxy``, docs/gateway.md).

A process the harness starts once per run (``python -m ale.gateway serve``): HTTP/1.1 on a Unix
socket for the agent, forwarded to allow-listed OpenAI and Anthropic upstreams with the real keys
added, every request recorded, usage metered, budgets and the phase's policy enforced; a control
socket for the harness. Modules: :mod:`~ale.gateway.config` (the configuration), :mod:`~ale.gateway.wire`
(the wire formats), :mod:`~ale.gateway.recording` and :mod:`~ale.gateway.budget` (pure), and the
I/O: :mod:`~ale.gateway.upstream`, :mod:`~ale.gateway.server`, :mod:`~ale.gateway.events`,
:mod:`~ale.gateway.cli`.
"""

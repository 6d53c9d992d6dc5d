"""Confining untrusted code, in layers that each assume the others failed: the
subprocess with a deadline and no secrets (process.py), the static check before import
(static_check.py, its allow-list in kernel_surface.py), the audit hook inside the process (audit_hook.py, its rules in audit_policy.py),
the OS sandbox (sandbox.py, open first: what a candidate may read and write; with namespace.py and
socket_filter.py), and the identity check of the judge's clocks and functions (tamper.py).

Never: imports a candidate, or loosens a rule for one.
"""

"""Fields that name an environment variable (``api_key_env``, ``token_env``, ``secret_env``,
the context API's ``api_keys``): a value that is not a variable name, or that looks like a
key pasted in its place, is refused, and the refusal never shows the value.

>>> check_env_name("OPENAI_API_KEY")
'OPENAI_API_KEY'
>>> looks_like_a_key("sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c")
True
"""

from __future__ import annotations

import re

__all__ = ["ENV_NAME", "check_env_name", "looks_like_a_key"]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefixes of common provider keys (OpenAI/Stripe sk-/sk_, GitHub, Slack, Google, Hugging Face,
# GitLab, AWS access key ids).
_KEY_PREFIXES = (
    "sk-",
    "sk_",
    "pk_",
    "rk_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "xox",
    "AIza",
    "hf_",
    "glpat-",
    "AKIA",
    "ASIA",
)
_MIN_KEY_LENGTH = 20


def looks_like_a_key(value: str) -> bool:
    """Whether ``value`` reads as a secret rather than a variable name: a known key prefix
    and 20+ characters, or 20+ characters mixing lower case, upper case and digits (variable
    names are words: ``OPENAI_API_KEY``, ``SUPPORT_KEY_2``)."""
    if len(value) < _MIN_KEY_LENGTH:
        return False
    if value.startswith(_KEY_PREFIXES):
        return True
    mixed = (
        any(c.islower() for c in value)
        and any(c.isupper() for c in value)
        and any(c.isdigit() for c in value)
    )
    return mixed or not ENV_NAME.fullmatch(value)


def check_env_name(value: str) -> str:
    """``value`` when it is an environment variable name; else a ``ValueError`` whose message
    does not contain it (pydantic reports it under the field's name)."""
    if looks_like_a_key(value):
        raise ValueError(
            "this looks like an API key, not the name of an environment variable: put the key "
            "in a variable (export MY_API_KEY=...) and write the variable's name here; keys "
            "never belong in a config file (the value is not shown)"
        )
    if not ENV_NAME.fullmatch(value):
        raise ValueError(
            "not an environment variable name (letters, digits and _ only, not starting with a "
            "digit); write the variable's name here (the value is not shown)"
        )
    return value

"""Attributes and options shared by the sgdeploy.host model modules (extends_documentation_fragment)."""

from __future__ import annotations


class ModuleDocFragment:
    # A module that changes files: full check mode, a diff of the folder's files before and after.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

    # The options of a module that talks to the hub.
    HUB = r"""
options:
  endpoint:
    description: Hugging Face hub (or mirror) URL.
    type: str
    default: https://huggingface.co
  timeout:
    description: Seconds one HTTP request may stall.
    type: float
    default: 60
"""

    # A module that only reads (or keeps nothing): full check mode, no diff.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

"""Options shared by the sgdeploy.host model modules that talk to the hub (extends_documentation_fragment).

Check and diff support of every module: the fragment ``sgdeploy.host.attributes``.
"""

from __future__ import annotations


class ModuleDocFragment:
    # The options of a module that talks to the hub (sgdeploy.host.model_attributes.hub).
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

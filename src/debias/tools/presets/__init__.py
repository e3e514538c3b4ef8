"""Paper presets (``*.yaml`` in this folder): a paper's protocol as named, versioned params, applied over params.yaml.

``catalog``      the preset files: :func:`load`, :func:`names`, :func:`compose`, :func:`describe`;
``params_file``  applying one to ``params.yaml`` in place (:func:`plan_apply`, :func:`write_atomic`).
"""

from debias.tools.presets.catalog import (PRESET_DIR, Preset, PresetError, compose, describe, load, names, parse_sets,
                                          select, set_args, shell_line)
from debias.tools.presets.params_file import Applied, plan_apply, read_params, rewrite, write_atomic

__all__ = ["PRESET_DIR", "Applied", "Preset", "PresetError", "compose", "describe", "load", "names", "parse_sets",
           "plan_apply", "read_params", "rewrite", "select", "set_args", "shell_line", "write_atomic"]

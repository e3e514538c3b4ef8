"""Group-inference methods (``groups.method``), one module each; every module declares its method
(:func:`debias.groups.registry.register_group_method`: the inference function, its params section with the source
of each default, display name, whether it reads the true attribute). :func:`debias.groups.registry.discover`
finds every module here; nothing else lists them. The modules import no torch at module level (the params schema
imports them)."""

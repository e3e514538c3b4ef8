"""The linear probe's variants (``probe.method``) and post-processings (``probe.postprocess``), one subpackage each:
its ``__init__.py`` declares it (:func:`debias.evaluation.variants.register_probe` /
:func:`~debias.evaluation.variants.register_postprocess`: its params section with the source of each default, the
splits it reads, the shared probe params it reads), its ``fit.py`` holds the code. The registry finds every
subpackage; nothing else lists them."""

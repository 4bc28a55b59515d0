"""Models for the demo, the tests and the experiments, kept apart from the pass.

``zoo`` holds small models with parallel branches, ``zoo_parallel`` their tensor and
expert parallel variants, ``hf_zoo`` Hugging Face models, ``stg`` problems of the
Standard Task Graph Set, and ``modelspec`` loads a model from a ``module:function``
string (``MODEL_SPEC``).

May import: scheduling.
experts may import: comm, dialects, scheduling (its layers are written with the air ops).
hand_example may import: dialects (a hand placement written with the air ops).
"""

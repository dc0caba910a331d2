"""Sphinx configuration of the API reference, built from the docstrings.

    .venv/bin/python -m sphinx -W -b html docs/api docs/api/_build   # needs gssgd[docs]

tests/test_api_docs.py builds it with warnings as errors and checks that every public name
(each module's ``__all__``) has a docstring there.
"""

project = "gssgd"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "imported-members": True}
html_theme = "alabaster"
exclude_patterns = ["_build"]

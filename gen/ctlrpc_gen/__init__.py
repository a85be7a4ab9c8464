"""ctlrpc_gen: the ctlrpc IDL compiler.

Stages, each in its own module and testable alone:

    lexer, parser   IDL text -> syntax tree (ast), following imports
    check           syntax tree -> validated, frozen model (model)
    render          model -> C files through jinja2 templates (the only stage that needs jinja2)

diag carries locations and diagnostics through all of them; cli ties them together; version
holds the version `ctlrpc-gen --version` prints.
The language is documented in docs/IDL.md.
"""

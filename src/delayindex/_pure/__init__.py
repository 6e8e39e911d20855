"""Pure-Python twins of the native structures in ``delayindex._native``.

They share the native API exactly (names, results and exceptions) and serve as the reference in
differential tests and as the fallback when the extension is missing or
``DELAYINDEX_NO_EXTENSIONS=1`` is set. Import them through ``delayindex._impl``.
"""

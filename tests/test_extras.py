"""The one helper that imports optional dependencies and names the extra that installs them."""

import json
import sys

import pytest

from fastrollout._extras import check_extra, require_extra

MISSING = "fastrollout_no_such_module"


def test_require_extra_returns_the_module() -> None:
    assert require_extra("json", extra="none", purpose="a test") is json


def test_require_extra_names_the_extra_and_the_module() -> None:
    with pytest.raises(ImportError) as info:
        require_extra(f"{MISSING}.sub", extra="offline", purpose="reading episodes")
    message = str(info.value)
    assert message.startswith(
        f"reading episodes needs {MISSING}: pip install 'fastrollout[offline]' (import failed: "
    )
    assert MISSING in message.partition("(import failed: ")[2]
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_require_extra_uses_the_given_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "json", None)  # `import json` fails
    with pytest.raises(ImportError, match=r"^this needs JSON: pip install 'fastrollout\[x\]'"):
        require_extra("json", extra="x", purpose="this", name="JSON")


def test_check_extra_looks_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tabnanny", raising=False)
    check_extra("tabnanny", extra="none", purpose="a test")
    assert "tabnanny" not in sys.modules
    with pytest.raises(ImportError) as info:
        check_extra(MISSING, extra="export", purpose="exporting")
    assert str(info.value) == f"exporting needs {MISSING}: pip install 'fastrollout[export]'"

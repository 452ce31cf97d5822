"""docs/env.md lists every setting with its default."""
from pathlib import Path

from gradpress.config import setting_docs

ENV_MD = (Path(__file__).parents[2] / "docs" / "env.md").read_text()


def test_every_setting_is_documented_with_its_default():
    for env, name, default, _ in setting_docs():
        row = f"| `{env}` | `{name}` | `{default!r}` |"
        assert row in ENV_MD, f"docs/env.md lacks or misstates {env}: expected a row starting {row}"

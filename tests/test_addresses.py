"""No web address the project has not checked: the package's metadata names none (no Project-URL),
and the report schema's `$id` is a URN naming its schema version, which claims no address (issue 42)."""
import json
import tomllib
from pathlib import Path

import dsv4spec
from dsv4spec.properties import report

HOME = Path(dsv4spec.__file__).resolve().parent.parent


def test_the_package_metadata_names_no_web_address():
    project = tomllib.loads((HOME / "pyproject.toml").read_text())["project"]
    assert "urls" not in project, project.get("urls")


def test_the_report_schema_id_is_a_urn_of_its_version_not_an_address():
    schema = json.loads(Path(report.__file__).with_name("report.schema.json").read_text())
    assert schema["$id"] == f"urn:dsv4spec:report:v{report.SCHEMA_VERSION}"

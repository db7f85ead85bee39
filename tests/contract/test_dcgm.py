"""The DCGM metric contract: one query, rewritten for each schema and prefix, in legacy units."""

from __future__ import annotations

import pytest

from gpuaware.config import ConfigError, load_config
from gpuaware.contract.dcgm import FAMILIES, SCHEMAS, exported_names, family_name, translate


def test_legacy_unprefixed_is_the_identity():
    q = 'sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node"}) / 100'
    assert translate(q, "dcgm-legacy", False) == q


def test_49_divides_back_to_legacy_units_and_renames_the_node_label():
    assert translate('avg(DCGM_FI_DEV_GPU_UTIL{Hostname="a"}) > 5', "dcgm-4.9", False) == \
        'avg((DCGM_FI_DEV_GPU_UTIL_RATIO{hostname="a"} / 0.01)) > 5'
    # A family whose 4.9.0 name is unconfirmed keeps its legacy name and unit: nothing to divide.
    assert translate("DCGM_FI_DEV_FB_USED * 1048576", "dcgm-4.9", False) == "DCGM_FI_DEV_FB_USED * 1048576"
    # A range vector cannot be divided: the (linear) range function's result is.
    assert translate("sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{a=\"b\"}[1h]))", "dcgm-4.9", False) == \
        'sum((increase(DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{a="b"}[1h]) / 0.001))'
    # Unit-free families are only renamed.
    assert translate("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0", "dcgm-4.9", False) == \
        "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0"
    assert translate("label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)", "dcgm-4.9", False, units=False) == \
        "label_values(DCGM_FI_DEV_GPU_UTIL_RATIO, hostname)"
    with pytest.raises(ValueError, match="cannot rescale"):
        translate("max_over_time(DCGM_FI_DEV_GPU_UTIL[5m])", "dcgm-4.9", False)


def test_410_is_49_with_the_pcie_families_per_second():
    q = 'DCGM_FI_PROF_PCIE_TX_BYTES{Hostname="a"} + DCGM_FI_PROF_PCIE_RX_BYTES + DCGM_FI_DEV_GPU_UTIL'
    assert translate(q, "dcgm-4.10", False) == ('DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{hostname="a"} + '
                                                'DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND + '
                                                '(DCGM_FI_DEV_GPU_UTIL_RATIO / 0.01)')
    assert translate(q, "dcgm-4.10", True) == ('gpuaware_dcgm_fi_prof_pcie_tx_bytes_per_second{hostname="a"} + '
                                               'gpuaware_dcgm_fi_prof_pcie_rx_bytes_per_second + '
                                               '(gpuaware_dcgm_fi_dev_gpu_util_ratio / 0.01)')
    assert translate(q, "dcgm-4.9", False).startswith("DCGM_FI_PROF_PCIE_TX_BYTES{")
    assert exported_names("dcgm-4.10", False) - exported_names("dcgm-4.9", False) == {
        "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND"}
    assert FAMILIES["DCGM_FI_PROF_PCIE_TX_BYTES"].help("dcgm-4.10").endswith("(in bytes/s).")


def test_prefix_renames_every_family_and_no_label():
    assert family_name("DCGM_FI_DEV_GPU_UTIL", True) == "gpuaware_dcgm_fi_dev_gpu_util"
    assert translate('count(DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION!=""})', "dcgm-legacy", True) == \
        'count(gpuaware_dcgm_fi_dev_gpu_util{DCGM_FI_DRIVER_VERSION!=""})'
    # 4.9.0's driver label is a label too: renamed, never prefixed.
    assert translate('count(DCGM_FI_DEV_XID_ERRORS{DCGM_FI_DRIVER_VERSION!=""})', "dcgm-4.9", True) == \
        'count(gpuaware_dcgm_fi_dev_xid_error{DCGM_FI_SYSTEM_DRIVER_VERSION!=""})'
    assert all(len({family_name(n, prefixed, schema) for n in FAMILIES}) == len(FAMILIES)
               for schema in SCHEMAS for prefixed in (False, True))


def test_counters_are_the_families_dcgm_exporters_csv_types_counter():
    counters = {n for n, f in FAMILIES.items() if f.type == "counter"}
    assert {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} == counters


@pytest.mark.parametrize(("key", "value", "field"), [
    ("metrics_schema", "dcgm-5", "agent.metrics_schema"),
    ("dcgm_exporter", "both", "agent.dcgm_exporter"),
])
def test_a_bad_schema_or_coexistence_switch_is_rejected_with_field_and_reason(tmp_path, key, value, field):
    path = tmp_path / "c.yaml"
    path.write_text(f"agent:\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    ((where, reason, source),) = err.value.problems
    assert where == field and "Input should be" in reason and source == f"file {path}"
    for schema in SCHEMAS:
        assert load_config(None, environ={"GPUAWARE_AGENT__METRICS_SCHEMA": schema}).agent.metrics_schema == schema

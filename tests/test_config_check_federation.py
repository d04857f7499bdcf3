"""Federation settings that can never run are refused before the run, with their numbers (issue 30,
item 2): by `hivemesh config check` and by the gateway at start, from one rule
(FederationConfig.check_cohorts); edge configs and every file under examples/ are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.cli.config import check_file
from peer.cli.main import main
from peer.files.config import ConfigError
from protocols.federation.config import FederationConfig
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure_config import SecureAggregationConfig

ROOT = Path(__file__).resolve().parent.parent
# what a user adds to `init`'s files to turn SecAgg on (identity uplink, a round long enough for it)
SECAGG = ("federation.uplink=\"identity\"", "federation.round_timeout_s=300",
          "federation.secure_aggregation.masking=true")


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One gateway and six edges, as `hivemesh init --gateways 1 --edges 6` writes them."""
    out = tmp_path_factory.mktemp("fed") / "fed"
    assert main(["init", "--gateways", "1", "--edges", "6", "--out", str(out)]) == 0
    return out


def secure(**keys: object) -> FederationConfig:
    table = {"uplink": "identity", "round_timeout_s": 300.0, **keys}
    return FederationConfig(**table, secure_aggregation=SecureAggregationConfig())  # type: ignore[arg-type]


def test_the_secagg_trap_is_refused_by_config_check_naming_min_roster(federation: Path) -> None:
    # init's fraction 0.5 of 6 edges asks 3 a round; SecAgg's clients accept a roster of 5 at least
    with pytest.raises(ConfigError) as refused:
        check_file(federation / "gw0.toml", (*SECAGG, "federation.min_clients=3"))
    text = str(refused.value)
    assert "min_roster = 5" in text and "asks 3" in text and "6 edge clients served" in text
    assert "set min_clients to at least 5" in text
    # the fix it names passes
    assert check_file(federation / "gw0.toml", (*SECAGG, "federation.min_clients=5")).startswith(
        "ok: gateway config")


def test_the_gateway_refuses_it_at_start_with_exit_2(federation: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    sets = [arg for key in (*SECAGG, "federation.min_clients=3") for arg in ("--set", key)]
    assert main(["peer", "--config", str(federation / "gw0.toml"), "--quiet", *sets]) == 2
    err = capsys.readouterr().err
    assert "min_roster = 5" in err and len(err.strip().splitlines()) == 1


def test_the_cohort_of_every_registered_client_is_checked() -> None:
    # min_registered = 6: a round opens with all six, asks 3 of them: still refused
    with pytest.raises(ValueError, match="asks 3"):
        secure(fraction=0.5, min_clients=3, min_registered=6).check_cohorts(6)
    secure(fraction=1.0, min_clients=3, min_registered=6).check_cohorts(6)   # asks all six
    secure(fraction=0.1, min_clients=5).check_cohorts(100)


def test_a_first_round_opened_too_early_is_warned_with_the_min_registered_that_avoids_it(
        federation: Path) -> None:
    config = secure(fraction=1.0, min_clients=3)
    config.check_cohorts(6)   # all six registered: every round runs
    assert config.first_rounds_short(6) == ("a round opened with 3 registered clients asks 3, fewer than "
                                            "the 5 secure aggregation needs, and fails: set "
                                            "min_registered = 5")
    assert secure(fraction=1.0, min_clients=3, min_registered=5).first_rounds_short(6) == ""
    line = check_file(federation / "gw0.toml",
                      (*SECAGG, "federation.min_clients=3", "federation.fraction=1.0"))
    assert line.startswith("ok: gateway config") and "warning: a round opened with 3" in line


def test_each_cohort_size_a_gateway_can_ask_is_checked_against_secagg() -> None:
    # threshold and degree: t = 4 of k = 4 neighbours runs with 5 asked (and t + 1 = 5 is the floor)
    FederationConfig(uplink="identity", round_timeout_s=300.0, fraction=1.0, min_clients=5,
                     secure_aggregation=SecureAggregationConfig(threshold=4, degree=4)).check_cohorts(8)
    # the ring's bound: a round of 12 asked, with max_clients = 10, would overflow it
    config = FederationConfig(uplink="identity", round_timeout_s=300.0, fraction=1.0, min_clients=5,
                              secure_aggregation=SecureAggregationConfig(max_clients=10))
    config.check_cohorts(10)
    with pytest.raises(ValueError, match=r"with 12 clients asked in a round: 12 clients exceed .*= 10"):
        config.check_cohorts(12)


def test_distributed_dp_checks_the_expected_cohort() -> None:
    dp = DifferentialPrivacyConfig(sampling_rate=0.1, noise_multiplier=0.5)
    secagg = SecureAggregationConfig(threshold=4, degree=6, max_clients=100)   # a roster of 5 at least

    def config(min_registered: int) -> FederationConfig:
        return FederationConfig(uplink="identity", round_timeout_s=300.0, min_clients=5,
                                min_registered=min_registered, differential_privacy=dp,
                                secure_aggregation=secagg)

    with pytest.raises(ValueError, match=r"asks 2 of them on average.*sampling_rate to at least 0.25"):
        config(0).check_cohorts(20)
    config(0).check_cohorts(60)


def test_fedbuff_with_secagg_is_refused_by_config_check(federation: Path) -> None:
    with pytest.raises(ConfigError, match="fedbuff"):
        check_file(federation / "gw0.toml",
                   (*SECAGG, "federation.min_clients=5", "federation.mode=\"fedbuff\""))


def test_a_roster_too_small_to_open_a_round_is_a_wait_said_not_an_error(federation: Path) -> None:
    line = check_file(federation / "gw0.toml", ("federation.min_clients=8",))
    assert line.startswith("ok: gateway config") and "until 2 more edge clients join" in line


def test_config_check_accepts_an_edge_config(federation: Path) -> None:
    line = check_file(federation / "e003.toml")
    assert line.startswith("ok: edge config") and "'e003' of gateway 'gw0'" in line


def test_config_check_names_an_edge_on_the_wrong_gateway(federation: Path, tmp_path: Path) -> None:
    text = (federation / "e003.toml").read_text().replace('gateway = "gw0"', 'gateway = "e000"')
    bad = federation / "e003-bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"key 'edge\.gateway'"):
        check_file(bad)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_config_check_accepts_every_example(path: Path) -> None:
    assert check_file(path).startswith("ok: ")


def test_a_simulated_federation_is_refused_by_the_same_rule(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "examples" / "federation-edge.toml"
    secagg = ("federation.server.secure_aggregation.masking=true", "federation.server.uplink=\"identity\"",
              "federation.server.aggregator=\"fedavg\"", "federation.server.round_timeout_s=300",
              "federation.server.over_selection=0", "federation.server.min_clients=3",
              "federation.server.fraction=0.3")
    with pytest.raises(ConfigError, match=r"10 clients per gateway.*asks 3"):
        check_file(example, secagg)
    sets = [arg for key in secagg for arg in ("--set", key)]
    assert main(["sim", str(example), "--out", str(tmp_path / "out"), *sets]) == 2
    assert "min_roster = 5" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dp_noise_above_the_clip_norm_is_warned_by_config_check_and_at_start(federation: Path) -> None:
    # the expected cohort q N = 0.5 x 6 = 3: noise z C / 3 per coordinate against the clip norm C
    def config(noise_multiplier: float) -> FederationConfig:
        dp = DifferentialPrivacyConfig(sampling_rate=0.5, noise_multiplier=noise_multiplier, clip_norm=0.5)
        return FederationConfig(uplink="identity", min_clients=3, differential_privacy=dp)

    assert config(3.0).noise_over_clip(6) == ""           # z C / (q N) = C: not above it
    assert config(4.0).noise_over_clip(6) == (
        "noise per coordinate 0.67 (noise_multiplier 4 x clip 0.5 / expected cohort 3) > clip 0.5: "
        "expect low accuracy; raise sampling_rate or serve more clients (a cohort above 4), or lower "
        "noise_multiplier")
    assert config(4.0).noise_over_clip(12) == ""          # twelve served: q N = 6
    assert config(4.0).warnings(6) == [config(4.0).noise_over_clip(6)]
    dp = "federation.differential_privacy"
    sets = ("federation.uplink=\"identity\"", "federation.min_clients=3", f"{dp}.sampling_rate=0.5",
            f"{dp}.clip_norm=0.5")
    noisy = check_file(federation / "gw0.toml", (*sets, f"{dp}.noise_multiplier=4.0"))
    assert noisy.startswith("ok: gateway config") and "warning: noise per coordinate 0.67" in noisy
    quiet = check_file(federation / "gw0.toml", (*sets, f"{dp}.noise_multiplier=1.0"))
    assert "warning" not in quiet

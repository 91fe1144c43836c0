"""A phone radio's energy per link technology: the sourced defaults of ``system.energy``.

The model is Huang et al.'s ("A close examination of performance and power characteristics of
4G LTE networks", MobiSys 2012, its data-transfer power model): while a transfer is on, the radio
draws ``P = α_u·t_u + α_d·t_d + β`` (``t``: throughput in Mbit/s), so a message of ``b`` bits
that takes ``s`` seconds costs ``α·b + β·s``: a J/bit term (α; 1 mW per Mbit/s = 1 nJ/bit) and
an active power (β, W). After a transfer the radio stays in high-power *tail* states until the
next transfer starts or the tail ends (``tail``: each state's seconds and watts, in order).

Every number below is the value AT&T's Application Resource Optimizer (ARO, the open-source
tool ``attdevsupport/ARO``, whose LTE energy is this model) ships in its default profiles, read
from its public source: ``ARODataAnalyzer/src/lte.conf`` and ``.../WiFi.conf`` and the 3G
profile ``.../i997.conf`` (the same values in ``attdevsupport/VideoOptimizer``'s
``ARO.Core/src/main/resources/*.conf``, charged by its ``ProfileFactoryImpl``: LTE
``(α_u/1000·up_Mbps + α_d/1000·down_Mbps + β)·s`` while transferring, the continuous-reception
tail at β, the DRX tail at the tail power between pings; Wi-Fi and 3G a state's power times its
seconds). ARO's LTE energy is the paper's model; its coefficients are taken as ARO ships them
(the paper's own table was not checked against here).

No sourced numbers: EVDO (Mahimahi's Verizon EVDO traces) and 5G (5Gophers): a run whose links
are of those kinds must give them (``system.energy.radios``).
"""

from __future__ import annotations

from dataclasses import dataclass

MW_PER_MBPS = 1e-9  # J/bit in one mW per Mbit/s (1e-3 W over 1e6 bit/s)


@dataclass(frozen=True)
class Radio:
    """One link technology's energy (J, W, seconds)."""

    down_j_per_bit: float  # J per bit received
    up_j_per_bit: float  # J per bit sent
    active_w: float  # W while a transfer is on (Huang et al.'s β)
    tail: tuple[tuple[float, float], ...] = ()  # (seconds, watts) of each tail state, in order

    def tail_j(self, room_s: float) -> float:
        """Joules of the tail in the first ``room_s`` seconds after a transfer (the tail is cut
        where the next transfer on this radio starts; ``inf``: the whole tail)."""
        spent, at = 0.0, 0.0
        for seconds, watts in self.tail:
            spent += watts * min(seconds, max(0.0, room_s - at))
            at += seconds
        return spent


def _drx_w(period_s: float, ping_s: float, ping_w: float, tail_w: float) -> float:
    """ARO's DRX state as a mean power: a ``ping_s`` ping at ``ping_w`` every ``period_s``, the
    tail power between pings (ARO's ``energyLTE``, its DRX cases, per second)."""
    return (ping_s * ping_w + (period_s - ping_s) * tail_w) / period_s


# LTE: ARO lte.conf: LTE_ALPHA_UP 438.39 and LTE_ALPHA_DOWN 51.97 (mW/Mbps), LTE_BETA 1.2 (W);
# after a transfer INACTIVITY_TIMER 0.1 s in continuous reception (charged at β), T_SHORT_DRX
# 0.02 s and T_LONG_DRX 10 s of DRX at P_TAIL 1.06 W with pings of T_DRX_PING 0.002 s at
# P_SHORT_DRX_PING = P_LONG_DRX_PING 1.68 W every 0.02 s (short) / 0.04 s (long): 1.122 W and
# 1.091 W on average. Not charged: the 0.26 s promotion at 1.21 W out of idle (T_PROMOTION,
# P_PROMOTION), which the clock does not time either.
_LTE_TAIL_W, _PING_S, _PING_W = 1.06, 0.002, 1.68
LTE = Radio(
    down_j_per_bit=51.97 * MW_PER_MBPS,
    up_j_per_bit=438.39 * MW_PER_MBPS,
    active_w=1.2,
    tail=(
        (0.1, 1.2),
        (0.02, _drx_w(0.02, _PING_S, _PING_W, _LTE_TAIL_W)),
        (10.0, _drx_w(0.04, _PING_S, _PING_W, _LTE_TAIL_W)),
    ),
)
# 3G (UMTS): ARO i997.conf (its default 3G profile, a Samsung i997 on AT&T's HSPA+): POWER_DCH
# 1.30 W while transferring (no J/bit term: ARO's 3G energy is a state's power times its
# seconds), then DCH_FACH_TIMER 4 s at POWER_DCH and FACH_IDLE_TIMER 10 s at POWER_FACH 0.30 W.
UMTS = Radio(0.0, 0.0, 1.30, ((4.0, 1.30), (10.0, 0.30)))
# Wi-Fi: ARO WiFi.conf / lte.conf: POWER_WIFI_ACTIVE 0.403 W while transferring and for
# WIFI_TAIL_TIME 0.25 s after (ARO charges the Wi-Fi tail at the active power).
WIFI = Radio(0.0, 0.0, 0.403, ((0.25, 0.403),))

SOURCED: dict[str, Radio] = {"lte": LTE, "umts": UMTS, "wifi": WIFI}

"""Jetson power rail trees: which INA3221 rails feed which, so a total never counts a rail twice.

A Jetson module meters several rails; some are parts of others (POM_5V_GPU is inside
POM_5V_IN on a Nano). `power_w` is the sum of the tree's roots; each tree names where its
shape comes from. Where no tree fits the rails a board reports, the total is every rail
summed and labelled "sum of rails" in the run summary (it can double-count or under-read).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgebench.telemetry.sysfs import ProfileMismatch

SUM_OF_RAILS = "sum of rails"


@dataclass(frozen=True)
class RailTree:
    modules: str
    parents: dict[str, str | None]  # rail -> the rail that feeds it; None: a root
    source: str

    @property
    def roots(self) -> list[str]:
        return [rail for rail, parent in self.parents.items() if parent is None]


RAIL_TREES: dict[str, RailTree] = {
    "jetson-nano": RailTree(
        "Jetson Nano (P3448), JetPack 4",
        {"POM_5V_IN": None, "POM_5V_GPU": "POM_5V_IN", "POM_5V_CPU": "POM_5V_IN"},
        "NVIDIA forum 'Power consumption monitoring' (forums.developer.nvidia.com/t/73608/8): POM_5V_IN is "
        "the module's whole 5 V input, the GPU and CPU rails are parts of it; jetson-stats issue #51"),
    "jetson-tx2": RailTree(
        "Jetson TX2, JetPack 4",
        {"VDD_IN": None, "VDD_SYS_GPU": "VDD_IN", "VDD_SYS_SOC": "VDD_IN", "VDD_4V0_WIFI": "VDD_IN",
         "VDD_SYS_CPU": "VDD_IN", "VDD_SYS_DDR": "VDD_IN"},
        "jetson-stats issue #51 (checked on TX2 by the maintainer): VDD_IN is the module input, the other "
        "rails are parts of it"),
    "jetson-orin-nx-nano": RailTree(
        "Jetson Orin Nano, Orin NX, Xavier NX",
        {"VDD_IN": None, "VDD_CPU_GPU_CV": "VDD_IN", "VDD_SOC": "VDD_IN"},
        "NVIDIA forum 'Interpretation of Jetson NX power rail' (forums.developer.nvidia.com/t/200883): "
        "VDD_IN is the total module power, VDD_CPU_GPU_CV and VDD_SOC are inside it; the same for Orin NX "
        "and Orin Nano (forums.developer.nvidia.com/t/242804, cited by jetson-stats)"),
    "jetson-agx-xavier": RailTree(
        "Jetson AGX Xavier",
        {"GPU": None, "CPU": None, "SOC": None, "CV": None, "VDDRQ": None, "SYS5V": None},
        "Jetson AGX Xavier Series Product Design Guide DG-09840-001 v2.5, 5.6.2 Power Monitor: each of the six "
        "monitors sits on its own supply input (GPU, CPU, SOC, CV, VDDRQ on SYS_VIN_HV; SYS5V on SYS_VIN_MV), "
        "so their sum is the module input (also NVIDIA forum t/81016, jetson-stats #51)"),
    "jetson-agx-orin": RailTree(
        "Jetson AGX Orin",
        {"VDD_GPU_SOC": None, "VDD_CPU_CV": None, "VIN_SYS_5V0": None, "VDDQ_VDD2_1V8AO": "VIN_SYS_5V0"},
        "NVIDIA Jetson Linux Developer Guide r35/r36, Jetson AGX Orin power monitors (1-0040: VDD_GPU_SOC, "
        "VDD_CPU_CV, VIN_SYS_5V0; 1-0041: VDDQ_VDD2_1V8AO); VDDQ_VDD2_1V8AO is fed from VIN_SYS_5V0 as NVIDIA's "
        "rail documentation is cited by public energy-measurement work, so it is not added again. No rail "
        "meters the module input: the total under-reads the board"),
}

# Rails that meter a whole module input; used where the board adds rails no tree knows.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


def matching_tree(labels: set[str]) -> str | None:
    """The tree whose rails include every label and whose roots are all present."""
    for name, tree in RAIL_TREES.items():
        if labels <= set(tree.parents) and set(tree.roots) <= labels:
            return name
    return None


class RailTotal:
    """How `power_w` is made from the rails a board reports: the profile's `total_rail`, the
    roots of a rail tree (the profile's `rail_tree`, else the one matching the rails), a
    module input rail, or, with none of these, every rail summed and labelled so."""

    def __init__(self, labels: set[str], total_rail: str | None = None, rail_tree: str | None = None):
        found = sorted(labels)
        tree = None
        if rail_tree is not None:
            if rail_tree not in RAIL_TREES:
                raise ProfileMismatch(f"sensors.power.rail_tree {rail_tree!r} is unknown; use one of "
                                      f"{sorted(RAIL_TREES)} or leave it out")
            tree = RAIL_TREES[rail_tree]
            strays = labels - set(tree.parents)
            missing = set(tree.roots) - labels
            if strays or missing:
                raise ProfileMismatch(f"sensors.power.rail_tree {rail_tree!r} ({tree.modules}) has rails "
                                      f"{sorted(tree.parents)}, this board reports {found}; fix rail_tree or the "
                                      "rails list")
        if total_rail is not None:
            if total_rail not in labels:
                raise ProfileMismatch(f"sensors.power.total_rail {total_rail!r} is not among the rails this board "
                                      f"reports: {found}; fix total_rail")
            if tree is not None and tree.roots != [total_rail]:
                raise ProfileMismatch(f"sensors.power.total_rail {total_rail!r} is not the only root of rail_tree "
                                      f"{rail_tree!r} (roots {tree.roots}); drop one of them")
            self.rails = [total_rail]
            self.source = f"{tree.modules} rail tree: {tree.source}" if tree else "the profile's total_rail"
            self.label = total_rail
        else:
            rail_tree = rail_tree or matching_tree(labels)
            inputs = [r for r in INPUT_RAILS if r in labels]
            if rail_tree is not None:
                tree = RAIL_TREES[rail_tree]
                self.rails, self.source = tree.roots, f"{tree.modules} rail tree: {tree.source}"
                self.label = " + ".join(self.rails)
            elif inputs:
                self.rails, self.label = [inputs[0]], inputs[0]
                self.source = f"{inputs[0]} meters the module input (NVIDIA); the other rails are parts of it"
            else:
                self.rails, self.label = found, SUM_OF_RAILS
                self.source = (f"no rail tree is known for the rails {found}: every rail is summed, which counts a "
                               "rail fed by another twice and misses what no rail meters")
        self.tree = rail_tree

    def total(self, watts: dict[str, float]) -> float | None:
        """The total from {rail label: watts}; None when a rail it needs was not read this time."""
        if not all(rail in watts for rail in self.rails):
            return None
        return sum(watts[rail] for rail in self.rails)

    def describe(self) -> dict[str, object]:
        """Summary fields: what `power_w` is and where that comes from."""
        return {"power_total": self.label, "power_total_rails": list(self.rails), "power_total_source": self.source}

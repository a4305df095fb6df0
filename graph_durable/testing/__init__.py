"""Test kit shipped with graph_durable: fake providers and deterministic fault injection."""

from graph_durable.testing.faults import FaultPlan, InjectedCrash, arm, disarm, fault_point
from graph_durable.testing.providers import FakeProvider

__all__ = ["FakeProvider", "FaultPlan", "InjectedCrash", "arm", "disarm", "fault_point"]

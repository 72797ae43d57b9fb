"""Node agent: PARFusion-owned worker pools, OS enforcement of NodePlans, node telemetry."""

"""Load balancer and capacity side effects of a drain: ELBv2 deregistration, replacement
capacity from an on-demand Auto Scaling group, or a webhook."""

from __future__ import annotations

from typing import Any

import requests

from handler.sidecar.errors import CapacityError


def deregister_target(elbv2: Any, target_group_arn: str, target_id: str,
                      port: int | None = None) -> None:
    """Stop new connections from the load balancer. The group's deregistration delay (default
    300 s, longer than any spot notice) must be lowered on the group itself; the drain's own
    in-flight wait is what protects requests already accepted."""
    target: dict[str, object] = {"Id": target_id}
    if port is not None:
        target["Port"] = port
    elbv2.deregister_targets(TargetGroupArn=target_group_arn, Targets=[target])


def target_states(elbv2: Any, target_group_arn: str) -> dict[str, str]:
    """{target id: state} for diagnostics ("healthy", "draining", "unused", ...)."""
    described = elbv2.describe_target_health(TargetGroupArn=target_group_arn)
    return {entry["Target"]["Id"]: entry["TargetHealth"]["State"]
            for entry in described["TargetHealthDescriptions"]}


def request_replacement(autoscaling: Any, group_name: str) -> int:
    """Raise the group's desired capacity by one; returns the new desired capacity.

    Read-then-set is not atomic: two instances interrupted at the same moment may both set
    N+1. That under-asks by one, which the group's own health checks later correct; it never
    over-asks. MaxSize is checked here because moto accepts values above it (AWS refuses).
    """
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])
    found = groups.get("AutoScalingGroups", [])
    if not found:
        raise CapacityError(f"Auto Scaling group {group_name!r} not found")
    current, maximum = int(found[0]["DesiredCapacity"]), int(found[0]["MaxSize"])
    if current + 1 > maximum:
        raise CapacityError(f"{group_name}: desired {current} is already at MaxSize {maximum}")
    # HonorCooldown=False: a replacement for a lost instance should not wait out a cooldown.
    autoscaling.set_desired_capacity(AutoScalingGroupName=group_name,
                                     DesiredCapacity=current + 1, HonorCooldown=False)
    return current + 1


def post_webhook(url: str, payload: dict[str, Any], timeout_s: float = 2.0,
                 session: requests.Session | None = None) -> None:
    http = session or requests.Session()
    try:
        response = http.post(url, json=payload, timeout=timeout_s)
    except requests.RequestException as err:
        raise CapacityError(f"webhook {url}: {type(err).__name__}") from err
    if not 200 <= response.status_code < 300:
        raise CapacityError(f"webhook {url}: HTTP {response.status_code}")

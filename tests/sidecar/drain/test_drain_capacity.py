"""ELBv2 deregistration and Auto Scaling desired capacity against moto in server mode."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

from handler.sidecar.drain.capacity import deregister_target, post_webhook, request_replacement, target_states
from handler.sidecar.errors import CapacityError


def client(moto: str, service: str) -> Any:
    return boto3.client(service, region_name="us-east-1", endpoint_url=moto)


INSTANCE = "i-0123456789abcdef0"  # what the sidecar would read from IMDS instance-id
IMAGE = "ami-12c6146b"  # one of moto's default AMIs; describe_images costs seconds in moto


def target_group_with_instance(moto: str) -> tuple[Any, str, str]:
    vpc = client(moto, "ec2").create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    elbv2 = client(moto, "elbv2")
    group = elbv2.create_target_group(Name="llm", Protocol="HTTP", Port=8080, VpcId=vpc,
                                      TargetType="instance")["TargetGroups"][0]["TargetGroupArn"]
    elbv2.register_targets(TargetGroupArn=group, Targets=[{"Id": INSTANCE, "Port": 8080}])
    return elbv2, group, INSTANCE


def on_demand_group(moto: str, desired: int, maximum: int) -> Any:
    autoscaling = client(moto, "autoscaling")
    autoscaling.create_launch_configuration(LaunchConfigurationName="od", ImageId=IMAGE,
                                            InstanceType="g5.xlarge")
    autoscaling.create_auto_scaling_group(AutoScalingGroupName="llm-on-demand",
                                          LaunchConfigurationName="od", MinSize=0,
                                          MaxSize=maximum, DesiredCapacity=desired,
                                          AvailabilityZones=["us-east-1a"])
    return autoscaling


def desired(autoscaling: Any) -> int:
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["llm-on-demand"])
    return groups["AutoScalingGroups"][0]["DesiredCapacity"]


def test_deregister_removes_the_target(moto: str) -> None:
    elbv2, group, instance = target_group_with_instance(moto)
    assert target_states(elbv2, group) == {instance: "healthy"}
    deregister_target(elbv2, group, instance, 8080)
    # moto drops the target at once; AWS shows "draining" for the deregistration delay.
    assert instance not in target_states(elbv2, group)


def test_deregister_unknown_group_raises(moto: str) -> None:
    elbv2, group, instance = target_group_with_instance(moto)
    with pytest.raises(elbv2.exceptions.TargetGroupNotFoundException):
        deregister_target(elbv2, group.replace("llm", "gone"), instance)


def test_replacement_raises_desired_capacity_by_one(moto: str) -> None:
    autoscaling = on_demand_group(moto, desired=1, maximum=4)
    assert request_replacement(autoscaling, "llm-on-demand") == 2
    assert desired(autoscaling) == 2


def test_replacement_refused_at_max_size(moto: str) -> None:
    autoscaling = on_demand_group(moto, desired=2, maximum=2)
    with pytest.raises(CapacityError, match="already at MaxSize 2"):
        request_replacement(autoscaling, "llm-on-demand")
    assert desired(autoscaling) == 2


def test_replacement_for_missing_group_raises(moto: str) -> None:
    with pytest.raises(CapacityError, match="not found"):
        request_replacement(client(moto, "autoscaling"), "nope")


class Hook:
    def __init__(self, status: int) -> None:
        self.bodies: list[dict[str, object]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhook_posts_json() -> None:
    hook = Hook(204)
    try:
        post_webhook(hook.url, {"event": "termination_notice"})
        assert hook.bodies == [{"event": "termination_notice"}]
    finally:
        hook.close()


def test_webhook_error_status_raises() -> None:
    hook = Hook(500)
    try:
        with pytest.raises(CapacityError, match="HTTP 500"):
            post_webhook(hook.url, {})
    finally:
        hook.close()

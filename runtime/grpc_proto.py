"""The KServe v2 gRPC messages (kserve_grpc.proto), built from a vendored descriptor.

Why vendored, not generated at image build time: the image would need grpcio-tools (protoc, ~10
MB and a compiler step in every build) for a file that changes once a year. Why a descriptor and
not the usual *_pb2.py modules: protoc's Python output pins the protobuf runtime it may run on
(gencode 6.x refuses a 5.x runtime with VersionError), and the images take protobuf from whatever
the framework layer pins; a serialized FileDescriptorProto loaded through
message_factory.GetMessageClass works on every protobuf from 4.21 to 6.x. It is loaded into a
private DescriptorPool, so tritonclient's own grpc_service.proto in the same process (tests,
benchmarks) never clashes with it.

The descriptor below is protoc's compilation of kserve_grpc.proto (grpcio-tools at development
time only). After editing the .proto, regenerate it:

    python -m ngcx_runtime.grpc_proto --regenerate      # rewrites DESCRIPTOR_B64 in this file

tests/runtime/test_grpc.py checks that the descriptor is the .proto's (when grpcio-tools is
installed) and that every message matches tritonclient's field for field.
"""

from __future__ import annotations

import base64
import functools
import sys
from pathlib import Path
from typing import Any

PROTO = Path(__file__).with_name("kserve_grpc.proto")
SERVICE = "inference.GRPCInferenceService"

# protoc --descriptor_set_out of kserve_grpc.proto (one FileDescriptorProto), base64.
DESCRIPTOR_B64 = (
    "ChFrc2VydmVfZ3JwYy5wcm90bxIJaW5mZXJlbmNlIhMKEVNlcnZlckxpdmVSZXF1ZXN0IigKElNlcnZlckxpdmVSZXNwb25zZRIS"
    "CgRsaXZlGAEgASgIUgRsaXZlIhQKElNlcnZlclJlYWR5UmVxdWVzdCIrChNTZXJ2ZXJSZWFkeVJlc3BvbnNlEhQKBXJlYWR5GAEg"
    "ASgIUgVyZWFkeSJBChFNb2RlbFJlYWR5UmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1lEhgKB3ZlcnNpb24YAiABKAlSB3ZlcnNp"
    "b24iKgoSTW9kZWxSZWFkeVJlc3BvbnNlEhQKBXJlYWR5GAEgASgIUgVyZWFkeSIXChVTZXJ2ZXJNZXRhZGF0YVJlcXVlc3QiZgoW"
    "U2VydmVyTWV0YWRhdGFSZXNwb25zZRISCgRuYW1lGAEgASgJUgRuYW1lEhgKB3ZlcnNpb24YAiABKAlSB3ZlcnNpb24SHgoKZXh0"
    "ZW5zaW9ucxgDIAMoCVIKZXh0ZW5zaW9ucyJEChRNb2RlbE1ldGFkYXRhUmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1lEhgKB3Zl"
    "cnNpb24YAiABKAlSB3ZlcnNpb24izwIKFU1vZGVsTWV0YWRhdGFSZXNwb25zZRISCgRuYW1lGAEgASgJUgRuYW1lEhoKCHZlcnNp"
    "b25zGAIgAygJUgh2ZXJzaW9ucxIaCghwbGF0Zm9ybRgDIAEoCVIIcGxhdGZvcm0SRwoGaW5wdXRzGAQgAygLMi8uaW5mZXJlbmNl"
    "Lk1vZGVsTWV0YWRhdGFSZXNwb25zZS5UZW5zb3JNZXRhZGF0YVIGaW5wdXRzEkkKB291dHB1dHMYBSADKAsyLy5pbmZlcmVuY2Uu"
    "TW9kZWxNZXRhZGF0YVJlc3BvbnNlLlRlbnNvck1ldGFkYXRhUgdvdXRwdXRzGlYKDlRlbnNvck1ldGFkYXRhEhIKBG5hbWUYASAB"
    "KAlSBG5hbWUSGgoIZGF0YXR5cGUYAiABKAlSCGRhdGF0eXBlEhQKBXNoYXBlGAMgAygDUgVzaGFwZSLXAQoOSW5mZXJQYXJhbWV0"
    "ZXISHwoKYm9vbF9wYXJhbRgBIAEoCEgAUglib29sUGFyYW0SIQoLaW50NjRfcGFyYW0YAiABKANIAFIKaW50NjRQYXJhbRIjCgxz"
    "dHJpbmdfcGFyYW0YAyABKAlIAFILc3RyaW5nUGFyYW0SIwoMZG91YmxlX3BhcmFtGAQgASgBSABSC2RvdWJsZVBhcmFtEiMKDHVp"
    "bnQ2NF9wYXJhbRgFIAEoBEgAUgt1aW50NjRQYXJhbUISChBwYXJhbWV0ZXJfY2hvaWNlIsMCChNJbmZlclRlbnNvckNvbnRlbnRz"
    "EiMKDWJvb2xfY29udGVudHMYASADKAhSDGJvb2xDb250ZW50cxIhCgxpbnRfY29udGVudHMYAiADKAVSC2ludENvbnRlbnRzEiUK"
    "DmludDY0X2NvbnRlbnRzGAMgAygDUg1pbnQ2NENvbnRlbnRzEiMKDXVpbnRfY29udGVudHMYBCADKA1SDHVpbnRDb250ZW50cxIn"
    "Cg91aW50NjRfY29udGVudHMYBSADKARSDnVpbnQ2NENvbnRlbnRzEiMKDWZwMzJfY29udGVudHMYBiADKAJSDGZwMzJDb250ZW50"
    "cxIjCg1mcDY0X2NvbnRlbnRzGAcgAygBUgxmcDY0Q29udGVudHMSJQoOYnl0ZXNfY29udGVudHMYCCADKAxSDWJ5dGVzQ29udGVu"
    "dHMinQgKEU1vZGVsSW5mZXJSZXF1ZXN0Eh0KCm1vZGVsX25hbWUYASABKAlSCW1vZGVsTmFtZRIjCg1tb2RlbF92ZXJzaW9uGAIg"
    "ASgJUgxtb2RlbFZlcnNpb24SDgoCaWQYAyABKAlSAmlkEkwKCnBhcmFtZXRlcnMYBCADKAsyLC5pbmZlcmVuY2UuTW9kZWxJbmZl"
    "clJlcXVlc3QuUGFyYW1ldGVyc0VudHJ5UgpwYXJhbWV0ZXJzEkUKBmlucHV0cxgFIAMoCzItLmluZmVyZW5jZS5Nb2RlbEluZmVy"
    "UmVxdWVzdC5JbmZlcklucHV0VGVuc29yUgZpbnB1dHMSUQoHb3V0cHV0cxgGIAMoCzI3LmluZmVyZW5jZS5Nb2RlbEluZmVyUmVx"
    "dWVzdC5JbmZlclJlcXVlc3RlZE91dHB1dFRlbnNvclIHb3V0cHV0cxIsChJyYXdfaW5wdXRfY29udGVudHMYByADKAxSEHJhd0lu"
    "cHV0Q29udGVudHMazQIKEEluZmVySW5wdXRUZW5zb3ISEgoEbmFtZRgBIAEoCVIEbmFtZRIaCghkYXRhdHlwZRgCIAEoCVIIZGF0"
    "YXR5cGUSFAoFc2hhcGUYAyADKANSBXNoYXBlEl0KCnBhcmFtZXRlcnMYBCADKAsyPS5pbmZlcmVuY2UuTW9kZWxJbmZlclJlcXVl"
    "c3QuSW5mZXJJbnB1dFRlbnNvci5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMSOgoIY29udGVudHMYBSABKAsyHi5pbmZlcmVu"
    "Y2UuSW5mZXJUZW5zb3JDb250ZW50c1IIY29udGVudHMaWAoPUGFyYW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZh"
    "bHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEa8wEKGkluZmVyUmVxdWVzdGVkT3V0cHV0VGVu"
    "c29yEhIKBG5hbWUYASABKAlSBG5hbWUSZwoKcGFyYW1ldGVycxgCIAMoCzJHLmluZmVyZW5jZS5Nb2RlbEluZmVyUmVxdWVzdC5J"
    "bmZlclJlcXVlc3RlZE91dHB1dFRlbnNvci5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMaWAoPUGFyYW1ldGVyc0VudHJ5EhAK"
    "A2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEaWAoPUGFy"
    "YW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2"
    "YWx1ZToCOAEi3wUKEk1vZGVsSW5mZXJSZXNwb25zZRIdCgptb2RlbF9uYW1lGAEgASgJUgltb2RlbE5hbWUSIwoNbW9kZWxfdmVy"
    "c2lvbhgCIAEoCVIMbW9kZWxWZXJzaW9uEg4KAmlkGAMgASgJUgJpZBJNCgpwYXJhbWV0ZXJzGAQgAygLMi0uaW5mZXJlbmNlLk1v"
    "ZGVsSW5mZXJSZXNwb25zZS5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMSSQoHb3V0cHV0cxgFIAMoCzIvLmluZmVyZW5jZS5N"
    "b2RlbEluZmVyUmVzcG9uc2UuSW5mZXJPdXRwdXRUZW5zb3JSB291dHB1dHMSLgoTcmF3X291dHB1dF9jb250ZW50cxgGIAMoDFIR"
    "cmF3T3V0cHV0Q29udGVudHMa0AIKEUluZmVyT3V0cHV0VGVuc29yEhIKBG5hbWUYASABKAlSBG5hbWUSGgoIZGF0YXR5cGUYAiAB"
    "KAlSCGRhdGF0eXBlEhQKBXNoYXBlGAMgAygDUgVzaGFwZRJfCgpwYXJhbWV0ZXJzGAQgAygLMj8uaW5mZXJlbmNlLk1vZGVsSW5m"
    "ZXJSZXNwb25zZS5JbmZlck91dHB1dFRlbnNvci5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMSOgoIY29udGVudHMYBSABKAsy"
    "Hi5pbmZlcmVuY2UuSW5mZXJUZW5zb3JDb250ZW50c1IIY29udGVudHMaWAoPUGFyYW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVID"
    "a2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEaWAoPUGFyYW1ldGVyc0VudHJ5"
    "EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEihQEK"
    "GE1vZGVsU3RyZWFtSW5mZXJSZXNwb25zZRIjCg1lcnJvcl9tZXNzYWdlGAEgASgJUgxlcnJvck1lc3NhZ2USRAoOaW5mZXJfcmVz"
    "cG9uc2UYAiABKAsyHS5pbmZlcmVuY2UuTW9kZWxJbmZlclJlc3BvbnNlUg1pbmZlclJlc3BvbnNlIs0BChJNb2RlbEluc3RhbmNl"
    "R3JvdXASEgoEbmFtZRgBIAEoCVIEbmFtZRI2CgRraW5kGAQgASgOMiIuaW5mZXJlbmNlLk1vZGVsSW5zdGFuY2VHcm91cC5LaW5k"
    "UgRraW5kEhQKBWNvdW50GAIgASgFUgVjb3VudBISCgRncHVzGAMgAygFUgRncHVzIkEKBEtpbmQSDQoJS0lORF9BVVRPEAASDAoI"
    "S0lORF9HUFUQARIMCghLSU5EX0NQVRACEg4KCktJTkRfTU9ERUwQAyJmCgpNb2RlbElucHV0EhIKBG5hbWUYASABKAlSBG5hbWUS"
    "MAoJZGF0YV90eXBlGAIgASgOMhMuaW5mZXJlbmNlLkRhdGFUeXBlUghkYXRhVHlwZRISCgRkaW1zGAQgAygDUgRkaW1zImcKC01v"
    "ZGVsT3V0cHV0EhIKBG5hbWUYASABKAlSBG5hbWUSMAoJZGF0YV90eXBlGAIgASgOMhMuaW5mZXJlbmNlLkRhdGFUeXBlUghkYXRh"
    "VHlwZRISCgRkaW1zGAMgAygDUgRkaW1zIokBChRNb2RlbER5bmFtaWNCYXRjaGluZxIwChRwcmVmZXJyZWRfYmF0Y2hfc2l6ZRgB"
    "IAMoBVIScHJlZmVycmVkQmF0Y2hTaXplEj8KHG1heF9xdWV1ZV9kZWxheV9taWNyb3NlY29uZHMYAiABKARSGW1heFF1ZXVlRGVs"
    "YXlNaWNyb3NlY29uZHMiMwoOTW9kZWxQYXJhbWV0ZXISIQoMc3RyaW5nX3ZhbHVlGAEgASgJUgtzdHJpbmdWYWx1ZSKOBAoLTW9k"
    "ZWxDb25maWcSEgoEbmFtZRgBIAEoCVIEbmFtZRIaCghwbGF0Zm9ybRgCIAEoCVIIcGxhdGZvcm0SGAoHYmFja2VuZBgRIAEoCVIH"
    "YmFja2VuZBIkCg5tYXhfYmF0Y2hfc2l6ZRgEIAEoBVIMbWF4QmF0Y2hTaXplEisKBWlucHV0GAUgAygLMhUuaW5mZXJlbmNlLk1v"
    "ZGVsSW5wdXRSBWlucHV0Ei4KBm91dHB1dBgGIAMoCzIWLmluZmVyZW5jZS5Nb2RlbE91dHB1dFIGb3V0cHV0EkoKEGR5bmFtaWNf"
    "YmF0Y2hpbmcYCyABKAsyHy5pbmZlcmVuY2UuTW9kZWxEeW5hbWljQmF0Y2hpbmdSD2R5bmFtaWNCYXRjaGluZxJECg5pbnN0YW5j"
    "ZV9ncm91cBgHIAMoCzIdLmluZmVyZW5jZS5Nb2RlbEluc3RhbmNlR3JvdXBSDWluc3RhbmNlR3JvdXASRgoKcGFyYW1ldGVycxgO"
    "IAMoCzImLmluZmVyZW5jZS5Nb2RlbENvbmZpZy5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMaWAoPUGFyYW1ldGVyc0VudHJ5"
    "EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLk1vZGVsUGFyYW1ldGVyUgV2YWx1ZToCOAEiQgoS"
    "TW9kZWxDb25maWdSZXF1ZXN0EhIKBG5hbWUYASABKAlSBG5hbWUSGAoHdmVyc2lvbhgCIAEoCVIHdmVyc2lvbiJFChNNb2RlbENv"
    "bmZpZ1Jlc3BvbnNlEi4KBmNvbmZpZxgBIAEoCzIWLmluZmVyZW5jZS5Nb2RlbENvbmZpZ1IGY29uZmlnIkYKFk1vZGVsU3RhdGlz"
    "dGljc1JlcXVlc3QSEgoEbmFtZRgBIAEoCVIEbmFtZRIYCgd2ZXJzaW9uGAIgASgJUgd2ZXJzaW9uIjkKEVN0YXRpc3RpY0R1cmF0"
    "aW9uEhQKBWNvdW50GAEgASgEUgVjb3VudBIOCgJucxgCIAEoBFICbnMi8gMKD0luZmVyU3RhdGlzdGljcxI2CgdzdWNjZXNzGAEg"
    "ASgLMhwuaW5mZXJlbmNlLlN0YXRpc3RpY0R1cmF0aW9uUgdzdWNjZXNzEjAKBGZhaWwYAiABKAsyHC5pbmZlcmVuY2UuU3RhdGlz"
    "dGljRHVyYXRpb25SBGZhaWwSMgoFcXVldWUYAyABKAsyHC5pbmZlcmVuY2UuU3RhdGlzdGljRHVyYXRpb25SBXF1ZXVlEkEKDWNv"
    "bXB1dGVfaW5wdXQYBCABKAsyHC5pbmZlcmVuY2UuU3RhdGlzdGljRHVyYXRpb25SDGNvbXB1dGVJbnB1dBJBCg1jb21wdXRlX2lu"
    "ZmVyGAUgASgLMhwuaW5mZXJlbmNlLlN0YXRpc3RpY0R1cmF0aW9uUgxjb21wdXRlSW5mZXISQwoOY29tcHV0ZV9vdXRwdXQYBiAB"
    "KAsyHC5pbmZlcmVuY2UuU3RhdGlzdGljRHVyYXRpb25SDWNvbXB1dGVPdXRwdXQSOQoJY2FjaGVfaGl0GAcgASgLMhwuaW5mZXJl"
    "bmNlLlN0YXRpc3RpY0R1cmF0aW9uUghjYWNoZUhpdBI7CgpjYWNoZV9taXNzGAggASgLMhwuaW5mZXJlbmNlLlN0YXRpc3RpY0R1"
    "cmF0aW9uUgljYWNoZU1pc3MigAIKFEluZmVyQmF0Y2hTdGF0aXN0aWNzEh0KCmJhdGNoX3NpemUYASABKARSCWJhdGNoU2l6ZRJB"
    "Cg1jb21wdXRlX2lucHV0GAIgASgLMhwuaW5mZXJlbmNlLlN0YXRpc3RpY0R1cmF0aW9uUgxjb21wdXRlSW5wdXQSQQoNY29tcHV0"
    "ZV9pbmZlchgDIAEoCzIcLmluZmVyZW5jZS5TdGF0aXN0aWNEdXJhdGlvblIMY29tcHV0ZUluZmVyEkMKDmNvbXB1dGVfb3V0cHV0"
    "GAQgASgLMhwuaW5mZXJlbmNlLlN0YXRpc3RpY0R1cmF0aW9uUg1jb21wdXRlT3V0cHV0Ir8CCg9Nb2RlbFN0YXRpc3RpY3MSEgoE"
    "bmFtZRgBIAEoCVIEbmFtZRIYCgd2ZXJzaW9uGAIgASgJUgd2ZXJzaW9uEiUKDmxhc3RfaW5mZXJlbmNlGAMgASgEUg1sYXN0SW5m"
    "ZXJlbmNlEicKD2luZmVyZW5jZV9jb3VudBgEIAEoBFIOaW5mZXJlbmNlQ291bnQSJwoPZXhlY3V0aW9uX2NvdW50GAUgASgEUg5l"
    "eGVjdXRpb25Db3VudBJDCg9pbmZlcmVuY2Vfc3RhdHMYBiABKAsyGi5pbmZlcmVuY2UuSW5mZXJTdGF0aXN0aWNzUg5pbmZlcmVu"
    "Y2VTdGF0cxJACgtiYXRjaF9zdGF0cxgHIAMoCzIfLmluZmVyZW5jZS5JbmZlckJhdGNoU3RhdGlzdGljc1IKYmF0Y2hTdGF0cyJW"
    "ChdNb2RlbFN0YXRpc3RpY3NSZXNwb25zZRI7Cgttb2RlbF9zdGF0cxgBIAMoCzIaLmluZmVyZW5jZS5Nb2RlbFN0YXRpc3RpY3NS"
    "Cm1vZGVsU3RhdHMiugEKGE1vZGVsUmVwb3NpdG9yeVBhcmFtZXRlchIfCgpib29sX3BhcmFtGAEgASgISABSCWJvb2xQYXJhbRIh"
    "CgtpbnQ2NF9wYXJhbRgCIAEoA0gAUgppbnQ2NFBhcmFtEiMKDHN0cmluZ19wYXJhbRgDIAEoCUgAUgtzdHJpbmdQYXJhbRIhCgti"
    "eXRlc19wYXJhbRgEIAEoDEgAUgpieXRlc1BhcmFtQhIKEHBhcmFtZXRlcl9jaG9pY2UiVwoWUmVwb3NpdG9yeUluZGV4UmVxdWVz"
    "dBInCg9yZXBvc2l0b3J5X25hbWUYASABKAlSDnJlcG9zaXRvcnlOYW1lEhQKBXJlYWR5GAIgASgIUgVyZWFkeSLKAQoXUmVwb3Np"
    "dG9yeUluZGV4UmVzcG9uc2USRQoGbW9kZWxzGAEgAygLMi0uaW5mZXJlbmNlLlJlcG9zaXRvcnlJbmRleFJlc3BvbnNlLk1vZGVs"
    "SW5kZXhSBm1vZGVscxpoCgpNb2RlbEluZGV4EhIKBG5hbWUYASABKAlSBG5hbWUSGAoHdmVyc2lvbhgCIAEoCVIHdmVyc2lvbhIU"
    "CgVzdGF0ZRgDIAEoCVIFc3RhdGUSFgoGcmVhc29uGAQgASgJUgZyZWFzb24inwIKGlJlcG9zaXRvcnlNb2RlbExvYWRSZXF1ZXN0"
    "EicKD3JlcG9zaXRvcnlfbmFtZRgBIAEoCVIOcmVwb3NpdG9yeU5hbWUSHQoKbW9kZWxfbmFtZRgCIAEoCVIJbW9kZWxOYW1lElUK"
    "CnBhcmFtZXRlcnMYAyADKAsyNS5pbmZlcmVuY2UuUmVwb3NpdG9yeU1vZGVsTG9hZFJlcXVlc3QuUGFyYW1ldGVyc0VudHJ5Ugpw"
    "YXJhbWV0ZXJzGmIKD1BhcmFtZXRlcnNFbnRyeRIQCgNrZXkYASABKAlSA2tleRI5CgV2YWx1ZRgCIAEoCzIjLmluZmVyZW5jZS5N"
    "b2RlbFJlcG9zaXRvcnlQYXJhbWV0ZXJSBXZhbHVlOgI4ASIdChtSZXBvc2l0b3J5TW9kZWxMb2FkUmVzcG9uc2UiowIKHFJlcG9z"
    "aXRvcnlNb2RlbFVubG9hZFJlcXVlc3QSJwoPcmVwb3NpdG9yeV9uYW1lGAEgASgJUg5yZXBvc2l0b3J5TmFtZRIdCgptb2RlbF9u"
    "YW1lGAIgASgJUgltb2RlbE5hbWUSVwoKcGFyYW1ldGVycxgDIAMoCzI3LmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxVbmxvYWRS"
    "ZXF1ZXN0LlBhcmFtZXRlcnNFbnRyeVIKcGFyYW1ldGVycxpiCg9QYXJhbWV0ZXJzRW50cnkSEAoDa2V5GAEgASgJUgNrZXkSOQoF"
    "dmFsdWUYAiABKAsyIy5pbmZlcmVuY2UuTW9kZWxSZXBvc2l0b3J5UGFyYW1ldGVyUgV2YWx1ZToCOAEiHwodUmVwb3NpdG9yeU1v"
    "ZGVsVW5sb2FkUmVzcG9uc2UiNQofU3lzdGVtU2hhcmVkTWVtb3J5U3RhdHVzUmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1lItcC"
    "CiBTeXN0ZW1TaGFyZWRNZW1vcnlTdGF0dXNSZXNwb25zZRJSCgdyZWdpb25zGAEgAygLMjguaW5mZXJlbmNlLlN5c3RlbVNoYXJl"
    "ZE1lbW9yeVN0YXR1c1Jlc3BvbnNlLlJlZ2lvbnNFbnRyeVIHcmVnaW9ucxppCgxSZWdpb25TdGF0dXMSEgoEbmFtZRgBIAEoCVIE"
    "bmFtZRIQCgNrZXkYAiABKAlSA2tleRIWCgZvZmZzZXQYAyABKARSBm9mZnNldBIbCglieXRlX3NpemUYBCABKARSCGJ5dGVTaXpl"
    "GnQKDFJlZ2lvbnNFbnRyeRIQCgNrZXkYASABKAlSA2tleRJOCgV2YWx1ZRgCIAEoCzI4LmluZmVyZW5jZS5TeXN0ZW1TaGFyZWRN"
    "ZW1vcnlTdGF0dXNSZXNwb25zZS5SZWdpb25TdGF0dXNSBXZhbHVlOgI4ASJ+CiFTeXN0ZW1TaGFyZWRNZW1vcnlSZWdpc3RlclJl"
    "cXVlc3QSEgoEbmFtZRgBIAEoCVIEbmFtZRIQCgNrZXkYAiABKAlSA2tleRIWCgZvZmZzZXQYAyABKARSBm9mZnNldBIbCglieXRl"
    "X3NpemUYBCABKARSCGJ5dGVTaXplIiQKIlN5c3RlbVNoYXJlZE1lbW9yeVJlZ2lzdGVyUmVzcG9uc2UiOQojU3lzdGVtU2hhcmVk"
    "TWVtb3J5VW5yZWdpc3RlclJlcXVlc3QSEgoEbmFtZRgBIAEoCVIEbmFtZSImCiRTeXN0ZW1TaGFyZWRNZW1vcnlVbnJlZ2lzdGVy"
    "UmVzcG9uc2UiMwodQ3VkYVNoYXJlZE1lbW9yeVN0YXR1c1JlcXVlc3QSEgoEbmFtZRgBIAEoCVIEbmFtZSLEAgoeQ3VkYVNoYXJl"
    "ZE1lbW9yeVN0YXR1c1Jlc3BvbnNlElAKB3JlZ2lvbnMYASADKAsyNi5pbmZlcmVuY2UuQ3VkYVNoYXJlZE1lbW9yeVN0YXR1c1Jl"
    "c3BvbnNlLlJlZ2lvbnNFbnRyeVIHcmVnaW9ucxpcCgxSZWdpb25TdGF0dXMSEgoEbmFtZRgBIAEoCVIEbmFtZRIbCglkZXZpY2Vf"
    "aWQYAiABKARSCGRldmljZUlkEhsKCWJ5dGVfc2l6ZRgDIAEoBFIIYnl0ZVNpemUacgoMUmVnaW9uc0VudHJ5EhAKA2tleRgBIAEo"
    "CVIDa2V5EkwKBXZhbHVlGAIgASgLMjYuaW5mZXJlbmNlLkN1ZGFTaGFyZWRNZW1vcnlTdGF0dXNSZXNwb25zZS5SZWdpb25TdGF0"
    "dXNSBXZhbHVlOgI4ASKOAQofQ3VkYVNoYXJlZE1lbW9yeVJlZ2lzdGVyUmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1lEh0KCnJh"
    "d19oYW5kbGUYAiABKAxSCXJhd0hhbmRsZRIbCglkZXZpY2VfaWQYAyABKANSCGRldmljZUlkEhsKCWJ5dGVfc2l6ZRgEIAEoBFII"
    "Ynl0ZVNpemUiIgogQ3VkYVNoYXJlZE1lbW9yeVJlZ2lzdGVyUmVzcG9uc2UiNwohQ3VkYVNoYXJlZE1lbW9yeVVucmVnaXN0ZXJS"
    "ZXF1ZXN0EhIKBG5hbWUYASABKAlSBG5hbWUiJAoiQ3VkYVNoYXJlZE1lbW9yeVVucmVnaXN0ZXJSZXNwb25zZSKOAgoTVHJhY2VT"
    "ZXR0aW5nUmVxdWVzdBJICghzZXR0aW5ncxgBIAMoCzIsLmluZmVyZW5jZS5UcmFjZVNldHRpbmdSZXF1ZXN0LlNldHRpbmdzRW50"
    "cnlSCHNldHRpbmdzEh0KCm1vZGVsX25hbWUYAiABKAlSCW1vZGVsTmFtZRokCgxTZXR0aW5nVmFsdWUSFAoFdmFsdWUYASADKAlS"
    "BXZhbHVlGmgKDVNldHRpbmdzRW50cnkSEAoDa2V5GAEgASgJUgNrZXkSQQoFdmFsdWUYAiABKAsyKy5pbmZlcmVuY2UuVHJhY2VT"
    "ZXR0aW5nUmVxdWVzdC5TZXR0aW5nVmFsdWVSBXZhbHVlOgI4ASLyAQoUVHJhY2VTZXR0aW5nUmVzcG9uc2USSQoIc2V0dGluZ3MY"
    "ASADKAsyLS5pbmZlcmVuY2UuVHJhY2VTZXR0aW5nUmVzcG9uc2UuU2V0dGluZ3NFbnRyeVIIc2V0dGluZ3MaJAoMU2V0dGluZ1Zh"
    "bHVlEhQKBXZhbHVlGAEgAygJUgV2YWx1ZRppCg1TZXR0aW5nc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5EkIKBXZhbHVlGAIgASgL"
    "MiwuaW5mZXJlbmNlLlRyYWNlU2V0dGluZ1Jlc3BvbnNlLlNldHRpbmdWYWx1ZVIFdmFsdWU6AjgBItYCChJMb2dTZXR0aW5nc1Jl"
    "cXVlc3QSRwoIc2V0dGluZ3MYASADKAsyKy5pbmZlcmVuY2UuTG9nU2V0dGluZ3NSZXF1ZXN0LlNldHRpbmdzRW50cnlSCHNldHRp"
    "bmdzGo0BCgxTZXR0aW5nVmFsdWUSHwoKYm9vbF9wYXJhbRgBIAEoCEgAUglib29sUGFyYW0SIwoMdWludDMyX3BhcmFtGAIgASgN"
    "SABSC3VpbnQzMlBhcmFtEiMKDHN0cmluZ19wYXJhbRgDIAEoCUgAUgtzdHJpbmdQYXJhbUISChBwYXJhbWV0ZXJfY2hvaWNlGmcK"
    "DVNldHRpbmdzRW50cnkSEAoDa2V5GAEgASgJUgNrZXkSQAoFdmFsdWUYAiABKAsyKi5pbmZlcmVuY2UuTG9nU2V0dGluZ3NSZXF1"
    "ZXN0LlNldHRpbmdWYWx1ZVIFdmFsdWU6AjgBItkCChNMb2dTZXR0aW5nc1Jlc3BvbnNlEkgKCHNldHRpbmdzGAEgAygLMiwuaW5m"
    "ZXJlbmNlLkxvZ1NldHRpbmdzUmVzcG9uc2UuU2V0dGluZ3NFbnRyeVIIc2V0dGluZ3MajQEKDFNldHRpbmdWYWx1ZRIfCgpib29s"
    "X3BhcmFtGAEgASgISABSCWJvb2xQYXJhbRIjCgx1aW50MzJfcGFyYW0YAiABKA1IAFILdWludDMyUGFyYW0SIwoMc3RyaW5nX3Bh"
    "cmFtGAMgASgJSABSC3N0cmluZ1BhcmFtQhIKEHBhcmFtZXRlcl9jaG9pY2UaaAoNU2V0dGluZ3NFbnRyeRIQCgNrZXkYASABKAlS"
    "A2tleRJBCgV2YWx1ZRgCIAEoCzIrLmluZmVyZW5jZS5Mb2dTZXR0aW5nc1Jlc3BvbnNlLlNldHRpbmdWYWx1ZVIFdmFsdWU6AjgB"
    "KvoBCghEYXRhVHlwZRIQCgxUWVBFX0lOVkFMSUQQABINCglUWVBFX0JPT0wQARIOCgpUWVBFX1VJTlQ4EAISDwoLVFlQRV9VSU5U"
    "MTYQAxIPCgtUWVBFX1VJTlQzMhAEEg8KC1RZUEVfVUlOVDY0EAUSDQoJVFlQRV9JTlQ4EAYSDgoKVFlQRV9JTlQxNhAHEg4KClRZ"
    "UEVfSU5UMzIQCBIOCgpUWVBFX0lOVDY0EAkSDQoJVFlQRV9GUDE2EAoSDQoJVFlQRV9GUDMyEAsSDQoJVFlQRV9GUDY0EAwSDwoL"
    "VFlQRV9TVFJJTkcQDRINCglUWVBFX0JGMTYQDjK3DwoUR1JQQ0luZmVyZW5jZVNlcnZpY2USSwoKU2VydmVyTGl2ZRIcLmluZmVy"
    "ZW5jZS5TZXJ2ZXJMaXZlUmVxdWVzdBodLmluZmVyZW5jZS5TZXJ2ZXJMaXZlUmVzcG9uc2UiABJOCgtTZXJ2ZXJSZWFkeRIdLmlu"
    "ZmVyZW5jZS5TZXJ2ZXJSZWFkeVJlcXVlc3QaHi5pbmZlcmVuY2UuU2VydmVyUmVhZHlSZXNwb25zZSIAEksKCk1vZGVsUmVhZHkS"
    "HC5pbmZlcmVuY2UuTW9kZWxSZWFkeVJlcXVlc3QaHS5pbmZlcmVuY2UuTW9kZWxSZWFkeVJlc3BvbnNlIgASVwoOU2VydmVyTWV0"
    "YWRhdGESIC5pbmZlcmVuY2UuU2VydmVyTWV0YWRhdGFSZXF1ZXN0GiEuaW5mZXJlbmNlLlNlcnZlck1ldGFkYXRhUmVzcG9uc2Ui"
    "ABJUCg1Nb2RlbE1ldGFkYXRhEh8uaW5mZXJlbmNlLk1vZGVsTWV0YWRhdGFSZXF1ZXN0GiAuaW5mZXJlbmNlLk1vZGVsTWV0YWRh"
    "dGFSZXNwb25zZSIAEksKCk1vZGVsSW5mZXISHC5pbmZlcmVuY2UuTW9kZWxJbmZlclJlcXVlc3QaHS5pbmZlcmVuY2UuTW9kZWxJ"
    "bmZlclJlc3BvbnNlIgASWwoQTW9kZWxTdHJlYW1JbmZlchIcLmluZmVyZW5jZS5Nb2RlbEluZmVyUmVxdWVzdBojLmluZmVyZW5j"
    "ZS5Nb2RlbFN0cmVhbUluZmVyUmVzcG9uc2UiACgBMAESTgoLTW9kZWxDb25maWcSHS5pbmZlcmVuY2UuTW9kZWxDb25maWdSZXF1"
    "ZXN0Gh4uaW5mZXJlbmNlLk1vZGVsQ29uZmlnUmVzcG9uc2UiABJaCg9Nb2RlbFN0YXRpc3RpY3MSIS5pbmZlcmVuY2UuTW9kZWxT"
    "dGF0aXN0aWNzUmVxdWVzdBoiLmluZmVyZW5jZS5Nb2RlbFN0YXRpc3RpY3NSZXNwb25zZSIAEloKD1JlcG9zaXRvcnlJbmRleBIh"
    "LmluZmVyZW5jZS5SZXBvc2l0b3J5SW5kZXhSZXF1ZXN0GiIuaW5mZXJlbmNlLlJlcG9zaXRvcnlJbmRleFJlc3BvbnNlIgASZgoT"
    "UmVwb3NpdG9yeU1vZGVsTG9hZBIlLmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxMb2FkUmVxdWVzdBomLmluZmVyZW5jZS5SZXBv"
    "c2l0b3J5TW9kZWxMb2FkUmVzcG9uc2UiABJsChVSZXBvc2l0b3J5TW9kZWxVbmxvYWQSJy5pbmZlcmVuY2UuUmVwb3NpdG9yeU1v"
    "ZGVsVW5sb2FkUmVxdWVzdBooLmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxVbmxvYWRSZXNwb25zZSIAEnUKGFN5c3RlbVNoYXJl"
    "ZE1lbW9yeVN0YXR1cxIqLmluZmVyZW5jZS5TeXN0ZW1TaGFyZWRNZW1vcnlTdGF0dXNSZXF1ZXN0GisuaW5mZXJlbmNlLlN5c3Rl"
    "bVNoYXJlZE1lbW9yeVN0YXR1c1Jlc3BvbnNlIgASewoaU3lzdGVtU2hhcmVkTWVtb3J5UmVnaXN0ZXISLC5pbmZlcmVuY2UuU3lz"
    "dGVtU2hhcmVkTWVtb3J5UmVnaXN0ZXJSZXF1ZXN0Gi0uaW5mZXJlbmNlLlN5c3RlbVNoYXJlZE1lbW9yeVJlZ2lzdGVyUmVzcG9u"
    "c2UiABKBAQocU3lzdGVtU2hhcmVkTWVtb3J5VW5yZWdpc3RlchIuLmluZmVyZW5jZS5TeXN0ZW1TaGFyZWRNZW1vcnlVbnJlZ2lz"
    "dGVyUmVxdWVzdBovLmluZmVyZW5jZS5TeXN0ZW1TaGFyZWRNZW1vcnlVbnJlZ2lzdGVyUmVzcG9uc2UiABJvChZDdWRhU2hhcmVk"
    "TWVtb3J5U3RhdHVzEiguaW5mZXJlbmNlLkN1ZGFTaGFyZWRNZW1vcnlTdGF0dXNSZXF1ZXN0GikuaW5mZXJlbmNlLkN1ZGFTaGFy"
    "ZWRNZW1vcnlTdGF0dXNSZXNwb25zZSIAEnUKGEN1ZGFTaGFyZWRNZW1vcnlSZWdpc3RlchIqLmluZmVyZW5jZS5DdWRhU2hhcmVk"
    "TWVtb3J5UmVnaXN0ZXJSZXF1ZXN0GisuaW5mZXJlbmNlLkN1ZGFTaGFyZWRNZW1vcnlSZWdpc3RlclJlc3BvbnNlIgASewoaQ3Vk"
    "YVNoYXJlZE1lbW9yeVVucmVnaXN0ZXISLC5pbmZlcmVuY2UuQ3VkYVNoYXJlZE1lbW9yeVVucmVnaXN0ZXJSZXF1ZXN0Gi0uaW5m"
    "ZXJlbmNlLkN1ZGFTaGFyZWRNZW1vcnlVbnJlZ2lzdGVyUmVzcG9uc2UiABJRCgxUcmFjZVNldHRpbmcSHi5pbmZlcmVuY2UuVHJh"
    "Y2VTZXR0aW5nUmVxdWVzdBofLmluZmVyZW5jZS5UcmFjZVNldHRpbmdSZXNwb25zZSIAEk4KC0xvZ1NldHRpbmdzEh0uaW5mZXJl"
    "bmNlLkxvZ1NldHRpbmdzUmVxdWVzdBoeLmluZmVyZW5jZS5Mb2dTZXR0aW5nc1Jlc3BvbnNlIgBiBnByb3RvMw=="
)


@functools.lru_cache(maxsize=1)
def _pool() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(DESCRIPTOR_B64))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


@functools.cache
def message(name: str) -> type:
    """The message class for `name` (e.g. "ModelInferRequest"), package inference."""
    from google.protobuf import message_factory

    desc = _pool().FindMessageTypeByName(f"inference.{name}")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(_pool()).GetPrototype(desc)   # protobuf < 4.22


def methods() -> list[tuple[str, str, str, bool]]:
    """(method, request message, response message, streaming) of the service, in the .proto's order."""
    service = _pool().FindServiceByName(SERVICE)
    return [(m.name, m.input_type.name, m.output_type.name, bool(m.client_streaming or m.server_streaming))
            for m in service.methods]


def compile_proto(proto: Path = PROTO) -> bytes:
    """protoc's FileDescriptorProto of the .proto (needs grpcio-tools: development time only)."""
    import tempfile

    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", proto.name])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fdp,) = fds.file
    return fdp.SerializeToString(deterministic=True)


def _regenerate() -> int:
    encoded = base64.b64encode(compile_proto()).decode()
    lines = "\n".join(f'    "{encoded[i:i + 100]}"' for i in range(0, len(encoded), 100))
    me = Path(__file__)
    text = me.read_text()
    start = text.index("DESCRIPTOR_B64 = ")
    end = text.index("\n\n", start)
    me.write_text(text[:start] + f"DESCRIPTOR_B64 = (\n{lines}\n)" + text[end:])
    print(f"{me}: descriptor of {PROTO.name} written ({len(encoded)} base64 chars)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        sys.exit(_regenerate())
    print("usage: python -m ngcx_runtime.grpc_proto --regenerate", file=sys.stderr)
    sys.exit(2)

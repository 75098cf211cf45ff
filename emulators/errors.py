"""hilconform's error tree: every error the harness raises on purpose, in four kinds.

What kind an error is decides the verdict, so the kinds are classes, and every
error of the harness is one of them::

    HilconformError
     ├── InfrastructureError (RuntimeError)  the test bed went wrong: reported "broken",
     │    │                                   never a failed clause, never a pass (exit 2)
     │    ├── ImageMissing, ToolMissing, QemuDied, QmpError, GuestAgentError,
     │    │   WaitTimeout (TimeoutError), FaultError                     emulators/errors.py
     │    ├── SocketInUse                                       emulators/vfio_user/server.py
     │    ├── RunRootUnsafe (the run root is not the user's own)      emulators/instance_dir.py
     │    ├── UnsafeTarget                                           fixtures/real_safety.py
     │    ├── RemoteCommandError ── HostUnreachable, LoginRefused  fixtures/remote_command.py
     │    ├── HostLacksRequirement, UnknownRuntimeModule       fixtures/runtime_deployment.py
     │    ├── HostPathUnavailable (a manifest's hostPath the node has not)  fixtures/image_plugin.py
     │    ├── ProfileMatchesNothing                                    fixtures/real_host.py
     │    ├── CapabilityMissing (LookupError)                      fixtures/host_protocol.py
     │    └── LabError ── LabgridMissing, CoordinatorGone, PlaceUnknown, PlaceHeld,
     │                    NoNetworkService, NotReserved               fixtures/labgrid_lab.py
     ├── BadInput (ValueError)               what the user gave is wrong: named precisely,
     │    │                                   before any VM starts where it can be (exit 2)
     │    ├── ProfileError (a host or real-host profile, a budget set)  emulators/errors.py
     │    ├── ModelError (a device model)                        emulators/vfio_user/model.py
     │    ├── HostPackagesError                                     emulators/host_packages.py
     │    ├── HostSpecError (--host)                                   fixtures/host_spec.py
     │    ├── CapabilityError, RulesError, ClaimError, OwnClauseError    fixtures/ data readers
     │    ├── WalkSyntaxError (a `walks` marker)                           fixtures/walks.py
     │    ├── PluginCommandError, PluginImageError, ImageError, ManifestError,
     │    │   ResourceNotRegistered (the plugin registers none of the named)
     │    │                                   (a device plugin as shipped)        fixtures/
     │    └── CertifyError, LabRunError, NotARunFolder, IncomparableRuns, CertificateInvalid,
     │        CatalogueError, BadNight, BadFleet, CoverageDataError                reports/
     └── ConformanceFailure (AssertionError) the system under test did something wrong:
          │                                   a failed clause (exit 1)
          ├── RuntimeUnresponsive, RuntimeProtocolViolation     fixtures/runtime_client.py
          ├── TransitionRulesBroken, TransitionRulesBrokenAfterTheTests  fixtures/transition_watch.py
          ├── DeclaredWalkMissing (a `walks` path not walked)         fixtures/walks_check.py
          ├── Untied (an ID the plugin ties to no managed device)     fixtures/plugin_ties.py
          ├── PluginExited (the plugin under test ended on its own)   fixtures/node_plugin.py
          └── PublishedTableError (the runtime's published table)  fixtures/transition_checker.py

    Inconclusive (its own pytest outcome)    a precondition the test bed missed, or a test
                                              bed too slow to judge: neither pass nor fail,
                                              the run incomplete (exit 2)  fixtures/errors.py,
                                                               fixtures/inconclusive_outcome.py

A plain ``assert`` in a suite is a ConformanceFailure too (pytest reports it as
failed). Errors outside the tree are answers, not failures of anyone: a refused
request (``RuntimeCallError``, ``StandInError``, ``ControlError``, vfio-user's
``ClientError``) is what a test asserts on, and the wire readers' own errors
(``MalformedMessage``, ``PeerClosed``) end one connection. The runtime under test
(``runtime/``) imports nothing of the harness and has its own: ``ProtocolError``
(a request that is not one), ``ConfigError``, ``LeaseError``, ``IllegalTransition``,
``OwnResourcesShort`` (a check that could not run for want of fds or memory),
``DeviceGone``, ``DeviceUnreachable``, ``KubeletAbsent``, ``WireError``.

What a run records (fixtures/run_record.py ``failure_kind``): an assertion, or an
answer of the runtime or the plugin that the test did not expect, is a failed
clause; so is any other exception of a test's body (a ``KeyError`` on a reply
without what the protocol promises), unless it began in this library, the test
bed (a sampler thread's ``RuntimeError``): that, and a fixture's crash, is an
error with no verdict.

Each message names what was wrong and, where there is one, the command that fixes it.
"""


class HilconformError(Exception):
    """Every error the harness raises on purpose (see the tree above)."""


class InfrastructureError(HilconformError, RuntimeError):
    """The test bed, not the system under test, went wrong."""


class BadInput(HilconformError, ValueError):
    """What the user gave (a profile, a host, a plugin, a run folder) is wrong; the message names it."""


class ConformanceFailure(HilconformError, AssertionError):
    """The system under test did something a clause forbids: a failed clause."""


class ProfileError(BadInput):
    """A host profile is unknown or malformed (names the file and the key)."""


class ImageMissing(InfrastructureError):
    """The guest image has not been built."""


class ToolMissing(InfrastructureError):
    """A host program (QEMU, qemu-nbd, ...) is not installed."""


class QemuDied(InfrastructureError):
    """The QEMU process exited while we still needed it."""


class QmpError(InfrastructureError):
    """A QMP command failed, or got no reply within its deadline."""


class GuestAgentError(InfrastructureError):
    """The guest agent did not answer in time, or a guest command failed to start."""


class WaitTimeout(InfrastructureError, TimeoutError):
    """A wait for an event ran past its deadline (the message says what was awaited)."""


class FaultError(InfrastructureError):
    """A fault could not be injected (unknown slot, no capability, or QEMU refused it)."""

/* SPDX-License-Identifier: Apache-2.0 */
/* Error names on the wire. Keep in step with proto/idl/io.regen.varlink
 * (tests/unit/test_idl.c holds them to it); the constructors, which take
 * each error's own parameters, are generated from it (errors_gen.h). */
#pragma once

#include "errors_gen.h"

#define RP_ERR_STALE_GENERATION    "io.regen.StaleGeneration"
#define RP_ERR_DEVICE_LOST         "io.regen.DeviceLost"
#define RP_ERR_DRAINING            "io.regen.Draining"
#define RP_ERR_NOT_PERMITTED       "io.regen.NotPermitted"
#define RP_ERR_OUT_OF_MEMORY       "io.regen.OutOfMemory"
#define RP_ERR_INVALID_OPERAND     "io.regen.InvalidOperand"
#define RP_ERR_NO_SUCH_DEVICE      "io.regen.NoSuchDevice"
#define RP_ERR_NO_SUCH_OBJECT      "io.regen.NoSuchObject"
#define RP_ERR_IMPORT_FAILED       "io.regen.ImportFailed"
#define RP_ERR_INVALID_MESSAGE     "io.regen.InvalidMessage"
#define RP_ERR_MESSAGE_TOO_LARGE   "io.regen.MessageTooLarge"
#define RP_ERR_LIMIT_EXCEEDED      "io.regen.LimitExceeded"
#define RP_ERR_TIMEOUT             "io.regen.Timeout"
#define RP_ERR_FAULT_INJECTION_DISABLED "io.regen.FaultInjectionDisabled"
#define RP_ERR_WRONG_ENDPOINT      "io.regen.WrongEndpoint"
#define RP_ERR_DETACHED            "io.regen.Detached"
#define RP_ERR_BACKEND             "io.regen.BackendError"
#define RP_ERR_COMM_FAILED         "io.regen.CommFailed"
#define RP_ERR_COMM_TIMEOUT        "io.regen.CommTimeout"
#define RP_ERR_COMM_IN_FLIGHT      "io.regen.CommInFlight"
#define RP_ERR_INVALID_JOB         "io.regen.InvalidJob"
#define RP_ERR_INVALID_PROGRAM     "io.regen.InvalidProgram"
#define RP_ERR_RUN_TORN            "io.regen.RunTorn"

#define RP_ERR_INTERFACE_NOT_FOUND "org.varlink.service.InterfaceNotFound"
#define RP_ERR_METHOD_NOT_FOUND    "org.varlink.service.MethodNotFound"
#define RP_ERR_METHOD_NOT_IMPLEMENTED "org.varlink.service.MethodNotImplemented"
#define RP_ERR_INVALID_PARAMETER   "org.varlink.service.InvalidParameter"
#define RP_ERR_PERMISSION_DENIED   "org.varlink.service.PermissionDenied"
#define RP_ERR_EXPECTED_MORE       "org.varlink.service.ExpectedMore"
